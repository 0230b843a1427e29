"""``trace synth``: synthetic block-diffusion traces (plain generator, ``--fit``, ``--like``, ``--params``)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register_synth(sub: argparse._SubParsersAction) -> None:
    """Add ``synth`` to the ``trace`` subcommands."""
    y = sub.add_parser("synth", help="write a synthetic block-diffusion trace (default: LLaDA2.0-mini's shape)",
                        description="Without --fit/--like/--params: the original generator at the shape flags. "
                                    "--fit TRACE: parameters estimated from a recorded trace, generated with its "
                                    "shape, fitted vs regenerated statistics printed. --like NAME: a published "
                                    "model's figures, every assumed one printed with its source.")
    y.add_argument("--out", required=True, help="trace file to write")
    y.add_argument("--overwrite", action="store_true", help="replace an existing --out / --save-params file")
    src = y.add_mutually_exclusive_group()
    src.add_argument("--fit", default=None, metavar="TRACE",
                     help="fit the generator to this recorded trace (default: none)")
    src.add_argument("--like", default=None, metavar="NAME",
                     help="a published model's workload: llada2.0-mini or llada2.0-flash (default: none)")
    src.add_argument("--params", default=None, metavar="JSON", help="parameters saved by --save-params (default: none)")
    y.add_argument("--save-params", default=None, metavar="JSON",
                   help="write the generator's parameters here (default: not written)")
    y.add_argument("--layers", type=int, default=None, help="MoE layers (plain generator; default 19)")
    y.add_argument("--experts", type=int, default=None, help="routed experts per layer (plain generator; default 256)")
    y.add_argument("--top-k", type=int, default=None, help="experts per token (plain generator; default 8)")
    y.add_argument("--block-length", type=int, default=None,
                   help="diffusion block length (plain generator; default 32; must match --like/--params)")
    y.add_argument("--blocks", type=int, default=None, help="blocks per sequence (default 4; for --fit the trace's)")
    y.add_argument("--batch-size", type=int, default=None, help="sequences decoded together (default 1)")
    y.add_argument("--sequences", type=int, default=None, help="sequences in the trace (default 4; for --fit the "
                                                              "trace's)")
    y.add_argument("--seed", type=int, default=0, help="random seed")
    y.set_defaults(func=synth)


def _check_synth(args: argparse.Namespace) -> None:
    """One-line errors before any work: missing inputs, unknown --like, files that would be replaced."""
    from ..sim.synth_like import like_names

    for flag, path in (("--fit", args.fit), ("--params", args.params)):
        if path is not None and not Path(path).is_file():
            raise ValueError(f"{flag} {path}: no such file")
    if args.like is not None and args.like not in like_names():
        raise ValueError(f"--like {args.like}: unknown; allowed: {', '.join(like_names())}")
    for flag, path in (("--out", args.out), ("--save-params", args.save_params)):
        if path is not None and Path(path).exists() and not args.overwrite:
            raise ValueError(f"{flag} {path}: exists; pass --overwrite to replace it")
        if path is not None and not Path(path).resolve().parent.is_dir():
            raise ValueError(f"{flag} {path}: directory {Path(path).parent} does not exist")
    shaped = [f"--{n.replace('_', '-')}" for n in ("layers", "experts", "top_k") if getattr(args, n) is not None]
    if shaped and (args.fit or args.like or args.params):
        raise ValueError(f"{', '.join(shaped)}: set by --fit/--like/--params; give them only to the plain generator")


def synth(args: argparse.Namespace) -> int:
    _check_synth(args)
    if not (args.fit or args.like or args.params):
        if args.save_params:
            raise ValueError("--save-params needs --fit, --like or --params (the plain generator has no "
                             "parameter file)")
        from ..sim.synthetic import synthetic_trace

        trace = synthetic_trace(num_layers=args.layers or 19, num_experts=args.experts or 256,
                                top_k=args.top_k or 8, block_length=args.block_length or 32,
                                num_blocks=args.blocks or 4,
                                batch=args.batch_size or 1, num_sequences=args.sequences or 4, hidden_size=2048,
                                moe_intermediate_size=512, seed=args.seed)
        trace.header["batch_size"] = args.batch_size or 1
        trace.save(args.out)
        print(f"synthetic trace: {trace.num_forwards} forwards, {trace.routing_entries} expert accesses -> {args.out}")
        return 0
    return synth_fitted(args)


def synth_fitted(args: argparse.Namespace) -> int:
    """--fit / --like / --params: the fitted generator (``oled_hf/sim/synth_fit.py``, ``synth_like.py``)."""
    from ..sim import synth_fit as sf
    from ..sim.synth_like import like
    from ..sim.synthetic import SynthParams, TraceShape, generate
    from ..sim.trace import load_trace

    real = load_trace(args.fit) if args.fit else None
    if real is not None:
        params = sf.fit(real, source=f"fitted on {Path(args.fit).name}")
    elif args.like:
        params = like(args.like)
    else:
        params = SynthParams.load(args.params)
    if args.block_length is not None and args.block_length != params.block_length:
        raise ValueError(f"--block-length {args.block_length}: these parameters are for block {params.block_length}")
    custom = any(v is not None for v in (args.sequences, args.blocks, args.batch_size))
    shape = sf.trace_shape(real) if real is not None and not custom else TraceShape.uniform(
        args.sequences or 4, args.blocks or 4, params.block_length, args.batch_size or 1,
        prompt_length=params.block_length)
    if args.save_params:
        params.save(args.save_params)
    trace = generate(params, shape, seed=args.seed)
    trace.save(args.out)
    print(f"synthetic workload ({params.source}): {params.num_layers} MoE layers x {params.num_experts} experts, "
          f"top-{params.top_k}, block {params.block_length}, {len(shape.sequences)} sequences x batch {shape.batch}, "
          f"{shape.num_blocks} blocks; {trace.num_forwards} forwards, {trace.routing_entries} expert accesses "
          f"-> {args.out}" + (f"; parameters -> {args.save_params}" if args.save_params else ""))
    if params.assumptions:
        print("figures and their sources:")
        print("\n".join(f"  - {a}" for a in params.assumptions))
    if real is not None:
        print(sf.format_compare(sf.compare(real, trace), left=Path(args.fit).name, right="regenerated"))
    else:
        print("statistics of the generated trace (mean over layers):")
        for key, v in sf.describe(trace).items():
            vals = [x for x in (v if isinstance(v, list) else [v]) if x is not None]
            print(f"  {key}: {sf._fmt(sum(vals) / len(vals)) if vals else '-'}")
    return 0
