"""``trace record`` and ``trace replay``: routing traces from real runs, replayed without the model."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..offload.config import KNOWN_POLICIES
from ..progress import add_quiet_argument, progress
from ..sim.hardware import add_cost_model_args
from .common import add_device_argument, add_model_argument, resolve_device, resolve_model


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="record routing traces and replay them through cache policies")
    tsub = p.add_subparsers(dest="trace_command", metavar="{record,replay}")
    r = tsub.add_parser("record", help="generate from prompts and record per-iteration routing")
    add_model_argument(r)
    r.add_argument("--prompts", required=True, help="text file (one prompt a line) or JSONL with 'prompt'/'question'")
    r.add_argument("--out", required=True, help="trace file to write")
    add_device_argument(r)
    r.add_argument("--block-length", type=int, default=None,
                   help="diffusion block length (default: the checkpoint's generation_config)")
    r.add_argument("--max-new-tokens", type=int, default=None,
                   help="most new tokens per prompt (default: the checkpoint's generation_config)")
    r.add_argument("--threshold", type=float, default=None,
                   help="confidence threshold to commit a token (default: the checkpoint's generation_config)")
    r.add_argument("--steps", type=int, default=None,
                   help="denoising steps per block (default: the checkpoint's generation_config; "
                        "give the block length when overriding it, so at least one token commits per step)")
    r.add_argument("--decoding", choices=["quality", "speed"], default=None,
                   help="LLaDA2.1 decoding preset (default: the checkpoint's generation_config)")
    r.add_argument("--editing-threshold", type=float, default=None, help="LLaDA2.1 token editing (default: off)")
    r.add_argument("--max-post-steps", type=int, default=None,
                   help="editing iterations after a block's masks (default: the preset's or 16)")
    r.add_argument("--limit", type=int, default=None, help="use only the first N prompts (default: all)")
    r.add_argument("--raw", action="store_true", help="do not wrap prompts in the chat template")
    r.add_argument("--batch-size", type=int, default=1, help="prompts per generate call (left-padded batch)")
    r.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    add_quiet_argument(r)
    r.set_defaults(func=record)
    y = tsub.add_parser("synth", help="write a synthetic block-diffusion trace (default: LLaDA2.0-mini's shape)",
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
    q = tsub.add_parser("replay", help="replay a trace through policies, next to full residency and Belady")
    q.add_argument("trace")
    q.add_argument("--cache-size", type=int, nargs="+", required=True, help="expert slots per MoE layer")
    q.add_argument("--policy", nargs="+", default=None, choices=KNOWN_POLICIES,
                   help="legacy policy names to replay, with --cpu-compute and --no-layer-adaptive (default: all, "
                        "unless --system is given)")
    q.add_argument("--system", nargs="+", default=None, metavar="SYSTEM",
                   help="composed systems to replay: RETENTION[+PREFETCH][+DISPATCH][+ALLOCATION], e.g. "
                        "lru+cpu+reuse+adaptive, or a preset (oled, mixtral-offloading, hybrimoe, ktransformers, "
                        "tide, moe-infinity, promoe, lru-full, ...); see oled_hf/offload/system.py "
                        "(default: the --policy list)")
    q.add_argument("--believed-cpu-scale", type=float, default=1.0, metavar="F",
                   help="the dispatcher believes the CPU is F x as fast as it is (time is charged at the truth)")
    q.add_argument("--believed-pcie-scale", type=float, default=1.0, metavar="F",
                   help="the dispatcher believes the H2D bandwidth is F x what it is")
    q.add_argument("--no-layer-adaptive", action="store_true", help="keep every layer's share of the cache fixed")
    q.add_argument("--cpu-compute", choices=["auto", "on", "off"], default="auto",
                   help="simulated CPU compute of misses (the simulated machine has an accelerator: auto = on)")
    q.add_argument("--cost-model", choices=["h200-pcie5", "recorded"], default="h200-pcie5",
                   help="simulated hardware: the H200 + PCIe 5.0 preset, or the model calibrated when recording")
    add_cost_model_args(q)
    q.add_argument("--warmup-sequences", type=int, default=0,
                   help="recorded sequences that warm the cache before counting and timing start")
    q.add_argument("--json", action="store_true", help="print JSON instead of a table")
    q.set_defaults(func=replay_cmd)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def read_prompts(path: str) -> list[str]:
    if not Path(path).is_file():
        raise ValueError(f"--prompts {path}: no such file (a text file, one prompt a line, or JSONL)")
    text = Path(path).read_text().splitlines()
    prompts = []
    for line in text:
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            row = json.loads(line)
            line = row.get("prompt") or row.get("question") or row.get("text")
            if line is None:
                raise ValueError(f"{path}: JSON line without 'prompt', 'question' or 'text': {row}")
        prompts.append(line)
    if not prompts:
        raise ValueError(f"{path} holds no prompts")
    return prompts


def check_record_paths(prompts: str, out: str) -> None:
    """Refuse, before any work, an --out that is a directory, lies in no directory, or is the prompts file."""
    o = Path(out)
    if o.is_dir():
        raise ValueError(f"--out {out}: is a directory; name the trace file to write (e.g. {o / 'run.trace'})")
    if not o.parent.is_dir():
        raise ValueError(f"--out {out}: directory {o.parent} does not exist")
    if Path(prompts).exists() and o.exists() and o.resolve() == Path(prompts).resolve():
        raise ValueError(f"--out {out} is the --prompts file: recording would overwrite its input")


def record(args: argparse.Namespace) -> int:
    check_record_paths(args.prompts, args.out)
    import torch
    from transformers import AutoModelForCausalLM

    import oled_hf  # noqa: F401

    from ..checkpoints.tokenizer import load_tokenizer
    from ..sim.recorder import TraceRecorder

    path = resolve_model(args.model)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.batch_size < 1:
        raise ValueError(f"--batch-size {args.batch_size} is invalid: must be >= 1")
    prompts = read_prompts(args.prompts)[: args.limit]
    model = AutoModelForCausalLM.from_pretrained(path, device_map=resolve_device(args.device)).eval()
    tok = load_tokenizer(path)
    gen = {k: v for k, v in dict(block_length=args.block_length, max_new_tokens=args.max_new_tokens,
                                  threshold=args.threshold, steps=args.steps, decoding=args.decoding,
                                  editing_threshold=args.editing_threshold,
                                  max_post_steps=args.max_post_steps).items() if v is not None}
    recorder = TraceRecorder(model, decoding=gen)
    recorder.writer.header["block_length"] = gen.get("block_length", recorder.writer.header["block_length"])
    recorder.writer.header["batch_size"] = args.batch_size
    recorder.writer.header["prompts"] = str(args.prompts)
    tok.padding_side = "left"
    new_tokens = 0
    bar = progress(total=len(prompts), desc="recording", unit="prompt", quiet=args.quiet)
    for i in range(0, len(prompts), args.batch_size):
        batch = prompts[i: i + args.batch_size]
        recorder.begin_sequence(i // args.batch_size)
        if args.raw:
            ids = tok(batch, return_tensors="pt", padding=True)
        else:
            ids = tok.apply_chat_template([[{"role": "user", "content": p}] for p in batch],
                                          add_generation_prompt=True, return_tensors="pt", return_dict=True,
                                          padding=True)
        with torch.no_grad():
            out = model.generate(**ids.to(model.device), **gen)
        new_tokens += (out.shape[1] - ids["input_ids"].shape[1]) * len(batch)
        bar.update(len(batch))
    bar.close()
    path = recorder.save(args.out)
    trace = recorder.writer.trace()
    print(f"recorded {len(prompts)} prompts, {trace.num_forwards} forwards, {trace.routing_entries} expert "
          f"accesses, {new_tokens} new tokens, {trace.edits()} edits -> {path}")
    return 0


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


def replay_cmd(args: argparse.Namespace) -> int:
    from ..offload.costmodel import CostModel
    from ..offload.system import parse_system
    from ..sim.hardware import cost_model_from_args, planner_seconds
    from ..sim.replay import compare, compare_systems, format_table
    from ..sim.trace import load_trace

    for name in args.system or []:
        parse_system(name)  # a bad system name: one line, before loading anything
    if args.system and (args.policy or args.no_layer_adaptive or args.cpu_compute != "auto"):
        raise ValueError("--system names every part: do not combine it with --policy, --cpu-compute or "
                         "--no-layer-adaptive")
    for flag, v in (("--believed-cpu-scale", args.believed_cpu_scale), ("--believed-pcie-scale",
                                                                        args.believed_pcie_scale)):
        if not v > 0:
            raise ValueError(f"{flag} {v} is invalid: must be a number > 0 (believed / true)")
    trace = load_trace(args.trace)
    if args.cost_model == "recorded":
        if "cost_model" not in trace.header:
            raise ValueError(f"{args.trace} has no recorded cost model (record it from an offloaded run)")
        cost = CostModel(**trace.header["cost_model"]).with_overrides(
            h2d_gbps=args.h2d_gbps, cpu_gbps=args.cpu_gbps, gpu_fixed_us=args.gpu_fixed_us,
            gpu_us_per_token=args.gpu_us_per_token, cpu_us_per_token=args.cpu_us_per_token)
    else:
        cost = cost_model_from_args(trace, args)
    too_big = [c for c in args.cache_size if not 1 <= c <= trace.num_experts]
    if too_big:
        raise ValueError(f"--cache-size {too_big[0]} is invalid: must be between 1 and num_experts={trace.num_experts}")
    believed = cost.believed(args.believed_cpu_scale, args.believed_pcie_scale)
    if args.system:
        results = compare_systems(trace, args.system, args.cache_size, cost_model=cost,
                                  planner_s=planner_seconds(args), warmup_sequences=args.warmup_sequences,
                                  believed=believed)
    else:
        results = compare(trace, args.policy or list(KNOWN_POLICIES), args.cache_size,
                          layer_adaptive=not args.no_layer_adaptive, cpu_compute=args.cpu_compute,
                          cost_model=cost, planner_s=planner_seconds(args), warmup_sequences=args.warmup_sequences,
                          believed=believed)
    if args.json:
        print(json.dumps([r.to_dict() for r in results], indent=2))
    else:
        print(f"trace {args.trace}: {trace.num_forwards} forwards, {trace.routing_entries} expert accesses, "
              f"{trace.num_layers} MoE layers x {trace.num_experts} experts; timed with "
              f"{cost.expert_bytes / 2**20:.2f} MiB experts, {cost.kernel} GPU kernel, planner "
              f"{'measured' if args.planner_us is None else f'{args.planner_us:g} us/access'}"
              + (f"; dispatcher believes CPU x{args.believed_cpu_scale:g}, PCIe x{args.believed_pcie_scale:g}"
                 if believed is not cost else ""))
        print(format_table(results))
    return 0
