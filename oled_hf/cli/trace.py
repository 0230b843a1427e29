"""``trace record`` and ``trace replay``: routing traces from real runs, replayed without the model.

``trace synth`` (synthetic workloads) lives in :mod:`oled_hf.cli.synth`.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from ..fileio import check_new_file
from ..offload.config import KNOWN_POLICIES
from ..options.aliases import DeprecatedFlag
from ..options.model import add_device_argument, add_model_argument
from ..progress import add_quiet_argument, progress
from .common import add_command, resolve_device, resolve_model
from .synth import register_synth


def register(sub: argparse._SubParsersAction) -> None:
    add_command(sub, "trace", "record routing traces and replay them through cache policies", configure)


def configure(p: argparse.ArgumentParser) -> None:
    tsub = p.add_subparsers(dest="trace_command", metavar="{record,synth,replay}")
    add_command(tsub, "record", "generate from prompts and record per-iteration routing", configure_record)
    register_synth(tsub)
    add_command(tsub, "replay", "replay a trace through policies, next to full residency and Belady", configure_replay)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def legacy_policy_advice(policies: list[str]) -> str:
    """What to write instead of ``--policy P ...`` in replay: the systems those names replay."""
    from ..offload.system import spelling, system_of_legacy

    return f"use --system {' '.join(spelling(system_of_legacy(p)) for p in policies)} (the systems it replays)"


def configure_record(r: argparse.ArgumentParser) -> None:
    add_model_argument(r)
    r.add_argument("--prompts", required=True, help="text file (one prompt a line) or JSONL with 'prompt'/'question'")
    r.add_argument("--out", required=True, help="trace file to write (its folder must exist)")
    r.add_argument("--overwrite", action="store_true",
                   help="replace an existing --out file (a link there is replaced, never written through; "
                        "default: refuse it before recording)")
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
    r.add_argument("--batch-size", type=int, default=1,
                   help="prompts per generate call (left-padded batch; at most the number of prompts is used)")
    r.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    add_quiet_argument(r)
    r.set_defaults(func=record)


def configure_replay(q: argparse.ArgumentParser) -> None:
    from ..sim.hardware import add_cost_model_args

    q.add_argument("trace", help="the trace file to replay")
    q.add_argument("--cache-size", type=int, nargs="+", required=True, help="expert slots per MoE layer")
    q.add_argument("--policy", nargs="+", default=None, choices=KNOWN_POLICIES, action=DeprecatedFlag,
                   advice=legacy_policy_advice,
                   help="deprecated: old policy names to replay, with --cpu-compute and --no-layer-adaptive; use "
                        "--system (default: all, unless --system is given)")
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


PROMPT_KEYS = ("prompt", "question", "text")


def read_prompts(path: str) -> list[str]:
    """The prompts of a text file (one a line) or JSONL (``prompt`` / ``question`` / ``text``), blank lines skipped."""
    if not Path(path).is_file():
        raise ValueError(f"--prompts {path}: no such file (a text file, one prompt a line, or JSONL)")
    prompts = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            line = _json_prompt(path, number, line)
        prompts.append(line)
    if not prompts:
        raise ValueError(f"{path} holds no prompts")
    return prompts


def _json_prompt(path: str, number: int, line: str) -> str:
    """The prompt of one JSONL line: the first of PROMPT_KEYS present, a non-empty string (an empty one
    is an error, not a reason to read the next key)."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{number}: not a JSON object ({err.msg}); give one prompt a line or JSONL") from None
    if not isinstance(row, dict):
        raise ValueError(f"{path}:{number}: a JSON {type(row).__name__}, not an object with 'prompt'")
    key = next((k for k in PROMPT_KEYS if k in row), None)
    if key is None:
        raise ValueError(f"{path}:{number}: JSON line without 'prompt', 'question' or 'text'")
    value = row[key]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{path}:{number}: {key}={value!r} is invalid: must be a non-empty string")
    return value


def check_record_paths(prompts: str, out: str, overwrite: bool = False) -> None:
    """Refuse, before any work, an --out that could not be written as asked: a folder, a missing or
    read-only folder, an existing file or link without --overwrite (:func:`check_new_file`), or the
    prompts file itself (even with --overwrite: recording would replace its own input)."""
    o = Path(out)
    if Path(prompts).exists() and (o.exists() or o.is_symlink()) and o.resolve() == Path(prompts).resolve():
        raise ValueError(f"--out {out} is the --prompts file: recording would overwrite its input")
    try:
        check_new_file(out, overwrite=overwrite, field="--out", flag="--overwrite")
    except ValueError as err:  # "--out='x'" reads oddly on a command line: "--out x"
        raise ValueError(str(err).replace(f"--out={out!r}", f"--out {out}")) from None


def check_record_sizes(args: argparse.Namespace) -> None:
    """The counts ``trace record`` takes, checked before the model loads: 0 is never read as "default"."""
    if args.batch_size < 1:
        raise ValueError(f"--batch-size {args.batch_size} is invalid: must be >= 1 (prompts per generate call)")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit {args.limit} is invalid: must be >= 1 (omit it to use every prompt)")
    cores = os.cpu_count() or 1
    if args.threads is not None and not 1 <= args.threads <= cores:
        raise ValueError(f"--threads {args.threads} is invalid: must be between 1 and this machine's {cores} CPU "
                         "cores (each thread is a stack torch allocates; omit it for torch's choice)")


def record(args: argparse.Namespace) -> int:
    check_record_sizes(args)
    check_record_paths(args.prompts, args.out, args.overwrite)
    import torch
    from transformers import AutoModelForCausalLM

    import oled_hf  # noqa: F401

    from ..checkpoints.tokenizer import load_tokenizer
    from ..offload.recorder import TraceRecorder

    path = resolve_model(args.model)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
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
    batches = [prompts[i: i + args.batch_size] for i in range(0, len(prompts), args.batch_size)]
    encoded = [encode_batch(tok, batch, args.raw) for batch in batches]
    config = model.generation_config
    block = int(gen.get("block_length") or config.block_length)
    most = int(gen.get("max_new_tokens") or config.max_new_tokens)
    expected = [blocks_to_decode(int(ids["input_ids"].shape[1]), most, block) for ids in encoded]
    # per decoded block, not per prompt: one prompt takes many seconds, and the estimate needs steps
    bar = progress(total=sum(expected), desc=f"recording {len(prompts)} prompts", unit="block", quiet=args.quiet)
    counter = block_counter(bar)
    model.add_iteration_observer(counter)
    try:
        for number, (batch, ids, blocks) in enumerate(zip(batches, encoded, expected)):
            recorder.begin_sequence(number)
            counter.seen = 0
            with torch.no_grad():
                out = model.generate(**ids.to(model.device), **gen)
            new_tokens += (out.shape[1] - ids["input_ids"].shape[1]) * len(batch)
            bar.update(max(0, blocks - counter.seen))  # an answer that ended early skips its last blocks
    finally:
        model.remove_iteration_observer(counter)
        bar.close()
    path = recorder.save(args.out)
    trace = recorder.writer.trace()
    print(f"recorded {len(prompts)} prompts, {trace.num_forwards} forwards, {trace.routing_entries} expert "
          f"accesses, {new_tokens} new tokens, {trace.edits()} edits -> {path}")
    return 0


def encode_batch(tok, batch: list[str], raw: bool):
    """A batch of prompts as ``generate`` inputs: left-padded, in the chat template unless ``raw``."""
    if raw:
        return tok(batch, return_tensors="pt", padding=True)
    return tok.apply_chat_template([[{"role": "user", "content": p}] for p in batch], add_generation_prompt=True,
                                   return_tensors="pt", return_dict=True, padding=True)


def blocks_to_decode(prompt_length: int, max_new_tokens: int, block_length: int) -> int:
    """Blocks one ``generate`` decodes: the prompt's last, partial block through the last new token's."""
    return -(-(prompt_length + max_new_tokens) // block_length) - prompt_length // block_length


def block_counter(bar):
    """An iteration observer advancing ``bar`` once per decoded block (``seen``: blocks of this generate)."""
    from ..modeling.events import IterationObserver  # here: torch, which the parser does not need

    class BlockCounter(IterationObserver):
        seen = 0

        def on_block_end(self, block_index, token_ids) -> None:
            self.seen += 1
            bar.update(1)

    return BlockCounter()


def replay_cmd(args: argparse.Namespace) -> int:
    from ..offload.costmodel import CostModel
    from ..offload.system import parse_system
    from ..offload.trace import load_trace
    from ..sim.hardware import cost_model_from_args, planner_seconds
    from ..sim.replay import compare, compare_systems, format_table

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
