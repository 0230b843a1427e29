"""``oled-moe benchmark``: TPOT and cache behaviour per system, next to full residency, in one run.

Flags follow the reference tool (``--model --device --block-length --cache-size --warmup-runs
--runs --profile --report-dir``) plus ``--system`` (composed systems, several) and ``--json``; the
answer length is ``--max-new-tokens`` as in every command (the reference tool's ``--gen-length``
is a deprecated alias, as is ``--policy``, the old retention names); the budget is
``--cache-size`` (several), ``--cache-ratio`` (a fraction or ``auto``) or ``--max-gpu-memory``.
Every configuration decodes the same prompts; tokens are checked against the resident run.

Configurations are measured round-robin: all are loaded first, then each run decodes every
prompt once per configuration, in an order that rotates from run to run. Load drift on a shared
machine then hits every configuration alike (one-after-another runs swung a ratio from 0.37 to
1.25). Each row reports the median TPOT over runs and its spread (max - min), and the ratio to
full residency is the median of the per-run ratios (each pair measured in the same round).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..fileio import check_new_files, write_text_atomically
from ..offload.config import KNOWN_POLICIES
from ..options.aliases import DeprecatedFlag, add_alias
from ..options.budget import add_budget_arguments, budget_choices, budget_name, check_budget_device
from ..options.model import add_device_argument, add_model_argument
from ..progress import add_quiet_argument, progress
from .benchmark_profile import format_split
from .common import add_command, cpu_compute_note, resolve_device, resolve_model

REPORT_NAME = "report.json"  # what --report-dir holds
DEFAULT_PROMPTS = ["Tell me a story about a ship that sails across the sea.",
                   "What is 123+456? Explain each step.",
                   "List five things you can find in a kitchen and what they are for."]


def register(sub: argparse._SubParsersAction) -> None:
    add_command(sub, "benchmark", "TPOT, hit rate, bytes copied per system vs full residency", configure)


def legacy_policy_advice(policies: list[str]) -> str:
    """What to write instead of ``--policy P ...``: the systems those names ran (with --cpu-compute auto)."""
    from ..offload.system import spelling, system_of_legacy

    return f"use --system {' '.join(spelling(system_of_legacy(p)) for p in policies)} (the systems it ran)"


def configure(p: argparse.ArgumentParser) -> None:
    from ..offload.dispatch import CPU_COMPUTE_MODES

    add_model_argument(p)
    add_device_argument(p)
    p.add_argument("--dtype", default=None, help="load dtype (default: the checkpoint's)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per prompt")
    add_alias(p, "--gen-length", "--max-new-tokens", "max_new_tokens", type=int, metavar="N")
    p.add_argument("--block-length", type=int, default=32, help="diffusion block length")
    p.add_argument("--threshold", type=float, default=None,
                   help="confidence threshold to commit a token (default: the checkpoint's generation_config)")
    p.add_argument("--steps", type=int, default=None,
                   help="denoising steps per block (default: the checkpoint's generation_config)")
    add_budget_arguments(p, several_sizes=True, default="none; one budget flag is required")
    p.add_argument("--system", nargs="+", default=None, metavar="SYSTEM",
                   help="composed systems to measure (OffloadConfig.system): RETENTION[+DISPATCH][+ALLOCATION], "
                        "e.g. lru+cpu+reuse+adaptive, or a preset (oled, lru-full, lfu-full, mixtral-offloading, "
                        "ktransformers, ...), with a prefetch part (oled+previous; the gate prefetchers run in "
                        "replay only); "
                        "--cpu-compute off, or auto on a CPU-only device, still copies every miss "
                        "(default: none, or oled lru as --policy if neither flag is given)")
    p.add_argument("--policy", nargs="+", default=None, choices=KNOWN_POLICIES, action=DeprecatedFlag,
                   advice=legacy_policy_advice,
                   help="deprecated: old retention policy names to measure, each with --cpu-compute and "
                        "layer-adaptive allocation; use --system (default: oled lru, unless --system is given)")
    p.add_argument("--cpu-compute", choices=list(CPU_COMPUTE_MODES), default="auto",
                   help="compute some misses on the CPU: auto = on beside an accelerator, off without one "
                        "(there host and device are the same cores); on = let the cost model split anyway")
    p.add_argument("--warmup-runs", type=int, default=1, help="untimed passes over the prompts first")
    p.add_argument("--runs", type=int, default=2, help="timed passes over the prompts")
    p.add_argument("--prompt", action="append", help="prompt (repeatable; default: three sample prompts)")
    p.add_argument("--profile", action="store_true",
                   help="split each row's forward time into attention, routing, shared expert, dense MLP, output "
                        "head, planner, copies and expert GEMMs (ms per forward; the device is synchronised "
                        "around timed sections)")
    p.add_argument("--skip-resident", action="store_true",
                   help="do not load full residency (a model larger than host memory): no ratio to full, "
                        "tokens not compared")
    p.add_argument("--report-dir", default=None,
                   help="write report.json (rows and per-layer stats) here; the folder is created if its parent "
                        "exists (default: nowhere)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing report.json in --report-dir")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--emulated-bandwidth-gbps", type=float, default=None,
                   help="--device emulated: the link's GB/s (default: an expert copies in the time PCIe 5 "
                        "copies LLaDA2.0-mini's, ~126 us)")
    p.add_argument("--emulated-latency-us", type=float, default=None,
                   help="--device emulated: per-copy latency, us (default: 5)")
    p.add_argument("--loop-reference", action="store_true",
                   help="also time full residency with the per-expert loop (the grouped kernels' reference)")
    add_quiet_argument(p)
    p.set_defaults(func=benchmark)


@dataclass
class Row:
    config: str
    tpot_ms: float  # median over runs
    tokens_per_forward: float
    tpot_spread_ms: float = 0.0  # max - min over runs
    hit_rate: float | None = None
    bytes_per_token: float | None = None
    cpu_share: float | None = None
    policy_ms_per_forward: float | None = None
    ratio_to_full: float | None = 1.0  # None: --skip-resident
    same_tokens: bool | None = True  # None: --skip-resident (nothing to compare with)
    cpu_compute: str | None = None  # the mode this row ran with: hit rate and CPU share depend on it
    system: str | None = None  # the parts that ran (retention+prefetch+dispatch+allocation)
    # --device emulated: the live wall clock beside the replay of the same run (benchmark_replay.py)
    tokens_identical: bool | None = None
    measured_tpot_s: float | None = None
    replay_tpot_s: float | None = None
    replay: dict | None = None
    profile: dict | None = None  # --profile: ms per forward per section (benchmark_profile.split)


def default_prompts(path: Path) -> list[str]:
    """The prompts decoded without ``--prompt``: a trained toy's held-out task questions, else the sample prompts.

    The long-answer toys answer only their tasks: a chat prompt gets EOS at once, so a benchmark of
    it would time a prefill and one token per prompt.
    """
    from ..toy.long import REPORT_NAME, load_mix
    from ..toy.long.tasks import heldout_problems

    if not (Path(path) / REPORT_NAME).is_file():
        return DEFAULT_PROMPTS
    return [p.question for spec in load_mix(path) for p in heldout_problems(spec, 1)]


def encode_prompts(tok, prompts: list[str]):
    return [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                    return_tensors="pt", return_dict=True) for p in prompts]


@dataclass
class Measured:
    """One configuration's model and what the round-robin runs gave."""

    name: str
    model: object
    tpot: list[float] = field(default_factory=list)  # seconds per output token, one per run
    outputs: list = field(default_factory=list)
    tokens_per_forward: float = 0.0
    tokens: int = 0
    seconds: float = 0.0  # wall time of the timed passes
    forwards: int = 0  # denoising forwards of the timed passes
    sections: object = None  # --profile: benchmark_profile.SectionTimes


def generate_all(model, inputs, gen: dict):
    """Decode every prompt once: (outputs, seconds, new tokens, iterations)."""
    import torch

    sync = (lambda: torch.cuda.synchronize()) if model.device.type == "cuda" else (lambda: None)
    seconds, tokens, iterations, outputs = 0.0, 0, 0, []
    for ids in inputs:
        sync()
        start = time.perf_counter()
        out = model.generate(**ids.to(model.device), **gen)
        sync()
        seconds += time.perf_counter() - start
        tokens += out.sequences.shape[1] - ids["input_ids"].shape[1]
        iterations += int(out.iterations.sum())
        outputs.append(out.sequences.cpu())
    return outputs, seconds, tokens, iterations


def measure_round_robin(configs: list[Measured], inputs, args, runs: int, warmup: int, tick=lambda: None) -> None:
    """Warm every configuration up, then per run decode every prompt with each, rotating the order."""
    gen = dict(max_new_tokens=args.max_new_tokens, block_length=args.block_length, return_dict_in_generate=True)
    if args.threshold is not None:
        gen["threshold"] = args.threshold
    if args.steps is not None:
        gen["steps"] = args.steps
    for _ in range(warmup):
        for c in configs:
            generate_all(c.model, inputs, gen)
            tick()
    for c in configs:
        if hasattr(c.model, "reset_offload_stats"):
            c.model.reset_offload_stats()
        if c.sections is not None:
            c.sections.reset()
    iterations = {c.name: 0 for c in configs}
    for r in range(runs):
        for i in range(len(configs)):
            c = configs[(i + r) % len(configs)]
            c.outputs, seconds, tokens, its = generate_all(c.model, inputs, gen)
            c.tpot.append(seconds / max(tokens, 1))
            c.tokens += tokens
            c.seconds += seconds
            iterations[c.name] += its
            tick()
    for c in configs:
        c.forwards = iterations[c.name]
        c.tokens_per_forward = c.tokens / max(iterations[c.name], 1)


def spread(values: list[float]) -> float:
    return max(values) - min(values) if values else 0.0


def paired_ratio(a: list[float], b: list[float]) -> float:
    """Median over runs of a[r] / b[r]: both measured in the same round."""
    return statistics.median(x / y for x, y in zip(a, b))


def offload_row(c: Measured, reference, full: Measured | None) -> Row:
    import torch

    model = c.model
    stats = model.offload_stats()
    total = stats["total"]
    expert_tokens = sum(int(x) for x in model._offload_runtime.controller.stats.gpu_expert_tokens)
    expert_tokens += total["cpu_expert_tokens"]
    return Row(
        config=c.name, tpot_ms=statistics.median(c.tpot) * 1e3, tokens_per_forward=c.tokens_per_forward,
        tpot_spread_ms=spread(c.tpot) * 1e3, hit_rate=total["hit_rate"],
        bytes_per_token=total["bytes_copied"] / max(c.tokens, 1),
        cpu_share=total["cpu_expert_tokens"] / max(expert_tokens, 1),
        policy_ms_per_forward=1e3 * total["policy_seconds"] / max(total["forwards"], 1),
        ratio_to_full=paired_ratio(c.tpot, full.tpot) if full is not None else None,
        cpu_compute=stats["cpu_compute"], system=model._offload_runtime.controller.system.parts,
        same_tokens=None if reference is None else all(torch.equal(a, b) for a, b in zip(c.outputs, reference)),
    )


def offload_choices(args: argparse.Namespace) -> list[tuple[str, dict]]:
    """(row name, OffloadConfig fields) per ``--system`` and ``--policy``, each validated before anything loads.

    A system the live runtime cannot run (a bad part, a prefetch part) is a one-line error naming the
    flag; so is a row named twice (the rows are keyed by name).
    """
    from ..offload.config import OffloadConfig
    from ..offload.system import spelling, system_of_legacy

    policies = args.policy if args.policy is not None else [] if args.system else ["oled", "lru"]
    choices = [(s, {"system": s}) for s in args.system or []]
    for p in policies:  # --policy is the CLI's own spelling: resolved here, never the deprecated alias
        try:
            choices.insert(policies.index(p), (p, {"system": spelling(system_of_legacy(p))}))
        except (KeyError, ValueError) as err:
            raise ValueError(f"--policy {p}: {err}") from None
    for name, fields in choices:
        try:
            OffloadConfig(cache_size=1, cpu_compute=args.cpu_compute, **fields)
        except ValueError as err:
            raise ValueError(f"--{next(iter(fields))} {name}: {err}") from None
    names = [name for name, _ in choices]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{twice[0]!r} is named twice by --system/--policy: name each configuration once")
    return choices


def check_counts(args: argparse.Namespace) -> None:
    """The counts benchmark takes, refused before anything loads (``--runs 0`` failed after loading every model,
    with "no median for empty data")."""
    for flag, value, least in (("--runs", args.runs, 1), ("--warmup-runs", args.warmup_runs, 0),
                               ("--max-new-tokens", args.max_new_tokens, 1), ("--block-length", args.block_length, 1),
                               ("--steps", args.steps, 1)):
        if value is not None and value < least:
            raise ValueError(f"{flag} {value} is invalid: must be at least {least}")


def benchmark(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    import oled_hf  # noqa: F401

    from ..checkpoints.tokenizer import load_tokenizer
    from ..modeling.experts import LOOP_EXECUTOR
    from ..offload.config import OffloadConfig

    check_counts(args)
    budgets = budget_choices(args)
    if not budgets:
        raise ValueError("give a budget to compare: --cache-size N [N ...] (slots per MoE layer), --cache-ratio R "
                         "(or auto), --max-gpu-memory SIZE or --gpu-memory-utilization F")
    choices = offload_choices(args)
    if args.report_dir:  # refused now, not after minutes of decoding
        check_new_files(args.report_dir, [REPORT_NAME], overwrite=args.overwrite, field="--report-dir",
                        flag="--overwrite", create=True)
    path = resolve_model(args.model)
    emulated = args.device == "emulated"
    device = "cpu" if emulated else resolve_device(args.device)
    check_budget_device(budgets, device)
    load = dict(device_map=device)
    link = {}
    if emulated:
        link = dict(device="emulated", emulated_bandwidth_gbps=args.emulated_bandwidth_gbps,
                    emulated_latency_us=args.emulated_latency_us)
        OffloadConfig(cache_size=1, **link)  # a bad link: one line, before anything loads
    else:
        given = [flag for flag, value in (("--emulated-bandwidth-gbps", args.emulated_bandwidth_gbps),
                                          ("--emulated-latency-us", args.emulated_latency_us)) if value is not None]
        if given:
            raise ValueError(f"{' and '.join(given)} {'needs' if len(given) == 1 else 'need'} --device emulated")
    traces = tempfile.TemporaryDirectory(prefix="oled-benchmark-") if emulated else None
    if args.dtype:
        load["dtype"] = getattr(torch, args.dtype)
    tok = load_tokenizer(path)
    inputs = encode_prompts(tok, args.prompt or default_prompts(path))
    configs = []
    full = None
    if not args.skip_resident:
        full = Measured("full residency", AutoModelForCausalLM.from_pretrained(path, **load).eval())
        configs.append(full)
    if args.loop_reference:
        loop = AutoModelForCausalLM.from_pretrained(path, **load).eval()
        for block in loop.moe_blocks():
            block.experts_executor = LOOP_EXECUTOR
        configs.append(Measured("full residency (per-expert loop)", loop))
    for budget in budgets:
        for name, fields in choices:
            if traces is not None:  # each emulated run records its routing, for its replay
                fields = {**fields, **link, "record_trace": str(Path(traces.name) / f"{len(configs)}.trace")}
            config = OffloadConfig(**budget, **fields, cpu_compute=args.cpu_compute)
            model = AutoModelForCausalLM.from_pretrained(path, offload_config=config, **load).eval()
            model._offload_runtime.profile = args.profile
            label = budget_label(budget, model.offload_stats()["slots_per_layer"])
            configs.append(Measured(f"{name} @ {label}", model))
    if args.profile:
        from .benchmark_profile import attach

        for c in configs:
            c.sections = attach(c.model)
    bar = progress(total=len(configs) * (args.warmup_runs + args.runs), desc="benchmark", unit="pass",
                   quiet=args.quiet)
    measure_round_robin(configs, inputs, args, args.runs, args.warmup_runs, bar.update)
    bar.close()
    reference = full.outputs if full is not None else None
    rows, details = [], {}
    for c in configs:
        if getattr(c.model, "_offload_runtime", None) is not None:
            rows.append(offload_row(c, reference, full))
            details[c.name] = c.model.offload_stats()
            if traces is not None:
                from .benchmark_replay import replay_measured

                rt = c.model._offload_runtime
                rec = replay_measured(c, Path(rt.config.record_trace), args.warmup_runs * len(inputs))
                rows[-1] = dataclasses.replace(rows[-1], tokens_identical=rows[-1].same_tokens,
                                               measured_tpot_s=rec.pop("measured_tpot_s"),
                                               replay_tpot_s=rec.pop("replay_tpot_s"), replay=rec)
        else:
            rows.append(Row(c.name, statistics.median(c.tpot) * 1e3, c.tokens_per_forward, spread(c.tpot) * 1e3,
                            ratio_to_full=paired_ratio(c.tpot, full.tpot),
                            same_tokens=all(torch.equal(a, b) for a, b in zip(c.outputs, reference))))
        if c.sections is not None:
            from .benchmark_profile import split

            rt = getattr(c.model, "_offload_runtime", None)
            timers = {} if rt is None else {k: float(v.sum()) for k, v in rt.timing.items()}
            rows[-1] = dataclasses.replace(rows[-1], profile=split(c.sections, timers, c.seconds, c.forwards))
    report = {"model": str(path), "device": device, "max_new_tokens": args.max_new_tokens,
              "block_length": args.block_length, "runs": args.runs, "order": "round-robin",
              "rows": [asdict(r) for r in rows]}
    if emulated:
        report["device"] = "emulated"
        traces.cleanup()
    if args.report_dir:
        write_report(Path(args.report_dir), {**report, "offload_stats": details})
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        notes = sorted({cpu_compute_note(d) for d in details.values()})
        profiles = [format_split(r.config, r.profile) for r in rows if r.profile is not None]
        print("\n".join([format_rows(rows), *(f"offloaded rows: {n}" for n in notes), *profiles]))
    return 0 if all(r.same_tokens is not False for r in rows) else 1


def write_report(folder: Path, report: dict) -> Path:
    """``folder/report.json``, written whole or not at all; ``folder`` (checked before the run) made if missing."""
    folder.mkdir(exist_ok=True)
    path = folder / REPORT_NAME
    write_text_atomically(json.dumps(report, indent=2, default=str), path)
    return path


def budget_label(budget: dict, slots_per_layer: float) -> str:
    """``cache size 8``, ``cache ratio 0.4``; budgets sized in bytes add their slots: ``... (12.0 slots/layer)``."""
    key = next(k for k in ("cache_size", "cache_ratio", "max_gpu_memory") if k in budget)
    label = budget_name(budget)
    sized = key == "max_gpu_memory" or budget[key] == "auto"
    return f"{label} ({slots_per_layer:.1f} slots/layer)" if sized else label


def format_rows(rows: list[Row]) -> str:
    head = ["config", "CPU compute", "TPOT ms", "spread", "tok/fwd", "hit rate", "bytes/token", "CPU share",
            "policy ms/fwd", "x full", "same tokens"]

    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    table = [head] + [[r.config, r.cpu_compute or "-", fmt(r.tpot_ms, ".2f"), fmt(r.tpot_spread_ms, ".2f"),
                       fmt(r.tokens_per_forward, ".2f"),
                       fmt(r.hit_rate, ".3f"),
                       fmt(r.bytes_per_token, ",.0f"), fmt(r.cpu_share, ".3f"), fmt(r.policy_ms_per_forward, ".3f"),
                       fmt(r.ratio_to_full, ".2f"), {True: "yes", False: "NO", None: "-"}[r.same_tokens]]
                      for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
