"""``trace synth``: synthetic block-diffusion traces (plain generator, ``--fit``, ``--like``, ``--params``)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..fileio import check_new_file, write_atomically
from .common import one_line

MAX_MEMORY_HELP = "4 GiB, oled_hf.sim.synth_check.MAX_MEMORY_GIB"  # the sim package imports torch: not at parse time


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
    y.add_argument("--blocks", type=int, default=None, help="blocks per sequence (default 4; for --fit "
                                                                  "the trace's)")
    y.add_argument("--batch-size", type=int, default=None, help="sequences decoded together (default 1)")
    y.add_argument("--sequences", type=int, default=None, help="sequences in the trace (default 4; --like 25: 24 "
                                                              "timed + 1 warm-up; --fit the trace's)")
    y.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    y.add_argument("--max-memory", type=float, default=None, metavar="GIB",
                   help=f"refuse a trace whose estimated memory exceeds this many GiB (default {MAX_MEMORY_HELP})")
    y.set_defaults(func=synth)


PLAIN = {"layers": 19, "experts": 256, "top_k": 8, "block_length": 32}  # the plain generator's defaults (mini's)
LIKE_SEQUENCES = 25  # --like's default: 24 timed sequences after the report's one warm-up
SHAPE = {"sequences": 4, "blocks": 4, "batch_size": 1}  # unpacked in this order
LIMITS = {"layers": "num_layers", "experts": "num_experts", "block_length": "block_length"}


def _flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def _value(args: argparse.Namespace, name: str) -> int:
    """The flag's value or its stated default: 0 is a value (refused by the checks), never replaced by it."""
    v = getattr(args, name)
    return (PLAIN | SHAPE)[name] if v is None else v


def _check_sizes(args: argparse.Namespace) -> None:
    """Every size flag in range (0 and negatives refused, not defaulted) and the seed non-negative."""
    from ..sim.synth_check import INT_LIMITS, MAX_MEMORY_GIB, check_float, check_int

    for name, key in LIMITS.items():
        if getattr(args, name) is not None:
            check_int(_flag(name), getattr(args, name), *INT_LIMITS[key])
    if args.top_k is not None:
        check_int("--top-k", args.top_k, 1, _value(args, "experts"))
    for name in SHAPE:
        if getattr(args, name) is not None:
            check_int(_flag(name), getattr(args, name), 1)
    check_int("--seed", args.seed, 0)
    args.max_memory = MAX_MEMORY_GIB if args.max_memory is None else check_float("--max-memory", args.max_memory,
                                                                                   0.0, 1e6, True)


def _check_plain_memory(args: argparse.Namespace) -> None:
    """The plain generator's trace fits --max-memory (arithmetic on the flags; nothing is allocated)."""
    from ..sim.synth_check import PLAIN_MAX_ITERATIONS, check_memory, memory_bytes, uniform_rows

    L, E, k, B = (_value(args, n) for n in PLAIN)
    seqs, blocks, batch = (_value(args, n) for n in SHAPE)
    its = min(batch * B, PLAIN_MAX_ITERATIONS)
    rows, widest, events = uniform_rows(seqs, blocks, B, batch, 8, its, blocks)
    check_memory(memory_bytes(L, E, k, rows, widest, events), args.max_memory,
                 f"--sequences {seqs} x --blocks {blocks} x --batch-size {batch} at --layers {L} x --experts {E}, "
                 f"--top-k {k}, --block-length {B} (up to {its} forwards a block)")


def _check_synth(args: argparse.Namespace) -> None:
    """One-line errors before any work: sizes, missing inputs, unknown --like, files that would be replaced."""
    from ..sim.synth_like import like_names

    _check_sizes(args)
    for flag, path in (("--fit", args.fit), ("--params", args.params)):
        if path is not None and not Path(path).is_file():
            raise ValueError(f"{flag} {path}: no such file")
    if args.like is not None and args.like not in like_names():
        raise ValueError(f"--like {args.like}: unknown; allowed: {', '.join(like_names())}")
    targets = [("--out", args.out), ("--save-params", args.save_params)]
    for flag, path in targets:
        if path is not None:
            check_new_file(path, overwrite=args.overwrite, field=flag, flag="--overwrite")
    if args.save_params is not None and Path(args.save_params).resolve() == Path(args.out).resolve():
        raise ValueError(f"--save-params {args.save_params}: the same file as --out")
    shaped = [_flag(n) for n in ("layers", "experts", "top_k") if getattr(args, n) is not None]
    if shaped and (args.fit or args.like or args.params):
        raise ValueError(f"{', '.join(shaped)}: set by --fit/--like/--params; give them only to the plain generator")
    if not (args.fit or args.like or args.params):
        if args.save_params:
            raise ValueError("--save-params needs --fit, --like or --params (the plain generator has no "
                             "parameter file)")
        _check_plain_memory(args)


class _WholeWrites:
    """A binary file whose ``write`` writes everything or raises the OS error (``os.write`` in a loop).

    Why: torch's own file writer reports a full disk or ``ulimit -f`` only as ``[enforce fail at
    inline_container.cc]``, and a buffered Python file as a short write ("unexpected pos"); neither names the
    OS error the user can act on."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            done += os.write(self.fd, view[done:])
        return done

    def flush(self) -> None:
        os.fsync(self.fd)


def _save_trace(trace, out: str) -> None:
    """``trace`` to ``out`` whole or not at all; a failed write is one line naming the path and the OS error."""
    def save(tmp: str) -> None:
        fd = os.open(tmp, os.O_WRONLY | os.O_TRUNC)
        try:
            trace.save(_WholeWrites(fd))  # torch.save takes a file-like object as well as a path
        finally:
            os.close(fd)

    try:
        write_atomically(save, out)
    except (OSError, RuntimeError) as exc:
        cause = exc.__context__ if isinstance(exc, RuntimeError) and isinstance(exc.__context__, OSError) else exc
        raise ValueError(f"--out {out}: could not write the trace ({one_line(cause)}); nothing was written") from exc


def synth(args: argparse.Namespace) -> int:
    _check_synth(args)
    if not (args.fit or args.like or args.params):
        from ..sim.synthetic import synthetic_trace

        L, E, k, B = (_value(args, n) for n in PLAIN)
        trace = synthetic_trace(num_layers=L, num_experts=E, top_k=k, block_length=B,
                                num_blocks=_value(args, "blocks"), batch=_value(args, "batch_size"),
                                num_sequences=_value(args, "sequences"), hidden_size=2048,
                                moe_intermediate_size=512, seed=args.seed)
        trace.header["batch_size"] = _value(args, "batch_size")
        _save_trace(trace, args.out)
        print(f"synthetic trace: {trace.num_forwards} forwards, {trace.routing_entries} expert accesses -> {args.out}")
        return 0
    return synth_fitted(args)


def synth_fitted(args: argparse.Namespace) -> int:
    """--fit / --like / --params: the fitted generator (``oled_hf/sim/synth_fit.py``, ``synth_like.py``)."""
    from ..offload.trace import load_trace
    from ..sim import synth_fit as sf
    from ..sim.synth_check import check_memory, memory_bytes, uniform_rows
    from ..sim.synth_like import calibrate_decoder, figures, format_figures, like
    from ..sim.synthetic import SynthParams, TraceShape, generate

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
    if real is not None and not custom:
        shape = sf.trace_shape(real)
    else:
        seqs, blocks, batch = (_value(args, n) for n in SHAPE)
        seqs = LIKE_SEQUENCES if args.like and args.sequences is None else seqs
        B = params.block_length
        rows, widest, events = uniform_rows(seqs, blocks, B, batch, B, B, blocks - 1)
        check_memory(memory_bytes(params.num_layers, params.num_experts, params.top_k, rows, widest, events),
                     args.max_memory, f"--sequences {seqs} x --blocks {blocks} x --batch-size {batch} at "
                     f"{params.num_layers} layers x {params.num_experts} experts, top-{params.top_k}, block {B}")
        shape = TraceShape.uniform(seqs, blocks, B, batch, prompt_length=B)
    if args.like:
        calibrate_decoder(params, shape, args.seed)
    trace = generate(params, shape, seed=args.seed, max_memory_gib=args.max_memory)
    if args.save_params:
        params.save(args.save_params)
    _save_trace(trace, args.out)
    print(f"synthetic workload ({params.source}): {params.num_layers} MoE layers x {params.num_experts} experts, "
          f"top-{params.top_k}, block {params.block_length}, {len(shape.sequences)} sequences x batch {shape.batch}, "
          f"{shape.num_blocks} blocks; {trace.num_forwards} forwards, {trace.routing_entries} expert accesses "
          f"-> {args.out}" + (f"; parameters -> {args.save_params}" if args.save_params else ""))
    if params.assumptions:
        print("figures and their sources:")
        print("\n".join(f"  - {a}" for a in params.assumptions))
    if args.like:
        print("stated figures, target vs achieved on this trace (layer means; +-5% required):")
        print(format_figures(figures(params, trace)))
    if real is not None:
        print(sf.format_compare(sf.compare(real, trace), left=Path(args.fit).name, right="regenerated"))
    else:
        print("statistics of the generated trace (mean over layers):")
        for key, v in sf.describe(trace).items():
            vals = [x for x in (v if isinstance(v, list) else [v]) if x is not None]
            print(f"  {key}: {sf._fmt(sum(vals) / len(vals)) if vals else '-'}")
    return 0
