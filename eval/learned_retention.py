"""How far learned retention gets towards Belady's, on held-out traces only (issue 65's table).

Per workload group (a name, its dev traces, its held-out traces): every system is tuned on the group's
dev traces only, with the report's budget of settings (``sim/report.py``: ``tune_many``, at most
``TUNING_BUDGET`` settings each, scored by mean x fused at 15/25/40%); then each held-out trace is
replayed once per system with its chosen setting, beside the Belady rung (Belady's retention, which
knows the whole future, with oled's tuned dispatch and allocation), the best offline schedule
(``sim/schedules/best.py``, charged the same planner time per access as every system) and the valid
LP bound (``sim/bounds/lp.py``). ``oled_hf/sim/capture.py`` makes the table: x fused per cell and the
share of the Belady rung's gain over the best fixed composition that the system under test captures.

    D=traces/dev H=traces/held-out
    python eval/learned_retention.py --out eval/learned \\
        --group deep=$D/deep-b16-bs1.trace:$H/deep-b16-bs1.trace,$H/deep-b32-bs1.trace \\
        --group mini-like=$D/mini-like-s1.trace,$D/mini-like-s2.trace:$H/mini-like-s11.trace,$H/mini-like-s12.trace

Simulated time (LLaDA2.0-mini's experts on H200 + PCIe 5, or the model a ``trace synth --like`` trace is like;
planner ``--planner-us`` per layer access for every system and schedule): the figures do not depend on the
machine. Writes ``OUT/report.md``, ``OUT/cells.json`` and ``OUT/share.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

from oled_hf.fileio import write_atomically
from oled_hf.offload.trace import load_trace
from oled_hf.sim import report as rp
from oled_hf.sim import report_seeds as rs
from oled_hf.sim.belady import request_sets
from oled_hf.sim.bounds import lower_bound
from oled_hf.sim.capture import CaptureCell, ratio_table, target_lines
from oled_hf.sim.hardware import MODEL_SHAPES, cost_model_from_args
from oled_hf.sim.ladder import rung_system
from oled_hf.sim.replay import replay
from oled_hf.sim.schedules import offline_schedules

SYSTEMS = ("learned", "oled", "lru-full", "lfu-full", "adaptive", "hybrimoe")


def parse_group(text: str) -> tuple[str, list[str], list[str]]:
    """``NAME=DEV[,DEV...]:HELD[,HELD...]``, every path an existing file and no held-out trace among the dev ones."""
    name, sep, rest = text.partition("=")
    dev, sep2, held = rest.partition(":")
    devs, helds = [p for p in dev.split(",") if p], [p for p in held.split(",") if p]
    if not (name and sep and sep2 and devs and helds):
        raise ValueError(f"--group {text!r}: expected NAME=DEV[,DEV...]:HELD[,HELD...]")
    for p in devs + helds:
        if not Path(p).is_file():
            raise ValueError(f"--group {text!r}: trace {p}: no such file")
    if {Path(p).resolve() for p in devs} & {Path(p).resolve() for p in helds}:
        raise ValueError(f"--group {text!r}: a trace is both dev and held-out; tune on dev traces only")
    return name, devs, helds


def cost_for(trace, args: argparse.Namespace):
    """The cost model a trace is timed with: the model a ``--like`` trace is like, else ``--as-model``."""
    like = rs.like_model(str(trace.header.get("model", "")))
    ns = argparse.Namespace(**{**vars(args), "as_model": like if like in MODEL_SHAPES else args.as_model})
    return cost_model_from_args(trace, ns)


def warmup(trace, wanted: int) -> int:
    return min(wanted, len(set(trace.arrays["fwd_seq"].tolist())) - 1)


def log(msg: str) -> None:
    print(f"[learned {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_group(name: str, devs: list[str], helds: list[str], args: argparse.Namespace, specs, planner: float,
              lp_first_only: bool) -> tuple[dict, list[CaptureCell]]:
    dev_traces = []
    for p in devs:
        tr = load_trace(p)
        dev_traces.append((tr, cost_for(tr, args), warmup(tr, args.warmup_sequences)))
    log(f"{name}: tuning {', '.join(s.name for s in specs)} on {', '.join(Path(p).name for p in devs)}")
    profile = rp.dev_profile(dev_traces[0][0])
    tuned = rp.tune_many(dev_traces, specs, planner, profile=profile)
    knobs = {k: v[0] for k, v in tuned.items()}
    cells: list[CaptureCell] = []
    for i, path in enumerate(helds):
        trace = load_trace(path)
        label = Path(path).name.removesuffix(".trace")
        cm, warm = cost_for(trace, args), warmup(trace, args.warmup_sequences)
        prof = profile if profile.shape == (trace.num_layers, trace.num_experts) else None
        log(f"{name}: {label} ({trace.num_layers} MoE layers x {trace.num_experts}, {trace.num_forwards} forwards)")
        runs = rp.run_systems(trace, label, specs, args.sizes, cm, planner, bounds=False, warmup_sequences=warm,
                              tuned=knobs, profile=prof)
        oled = rp.resolve(next(s for s in specs if s.name == "oled"), knobs.get("oled"), prof)
        future = list(request_sets(trace))
        for pct in args.sizes:
            size = rp.slots_for(pct, trace.num_experts)
            mine = {r.system: r.result for r in runs if r.pct == pct}
            full = next(iter(mine.values())).full_time_s
            rung = replay(trace, "belady rung", size, system=rung_system(oled, "belady", future), cost_model=cm,
                          planner_s=planner, warmup_sequences=warm)
            cell = CaptureCell(label, pct, args.ours, {k: v.sim_time_s for k, v in mine.items()}, full,
                               rung.sim_time_s)
            if pct in args.offline_sizes:
                log(f"{name}: {label} {pct:g}%: offline schedules")
                cell.offline_s = offline_schedules(trace, cm, size, oled, warm, planner_s=planner).best_s
            if args.lp_window and (i == 0 or not lp_first_only):
                log(f"{name}: {label} {pct:g}%: LP bound (windows of {args.lp_window} forwards)")
                cell.bound_ratio = lower_bound("lp", trace, cm, size * trace.num_layers, warm,
                                               window_forwards=args.lp_window).ratio_to_full
            cells.append(cell)
            share = cell.share
            log(f"{name}: {label} {pct:g}%: " + ", ".join(f"{k} {cell.x_fused(v):.3f}" for k, v in mine.items() for v in
                                                       [v.sim_time_s]) + f", rung {cell.x_fused(cell.rung_s):.3f}, "
                f"share {'-' if share is None else f'{share:.2f}'}")
    return tuned, cells


def share_plot(cells: list[CaptureCell], path: Path, note: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = list(dict.fromkeys(c.trace for c in cells))
    pcts = sorted({c.pct for c in cells})
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(traces) + 2), 4))
    width = 0.8 / len(pcts)
    for j, pct in enumerate(pcts):
        vals = [next((c.share for c in cells if c.trace == t and c.pct == pct), None) for t in traces]
        ax.bar([i + j * width for i in range(len(traces))], [0.0 if v is None else v for v in vals], width,
               label=f"{pct:g}%")
    ax.axhline(0.5, color="k", ls="--", lw=0.8)
    ax.axhline(0.0, color="k", lw=0.6)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(traces))])
    ax.set_xticklabels(traces, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("share of the Belady rung's gain captured")
    ax.set_title(f"{cells[0].ours} vs the best fixed composition (dashed: the target 0.5)")
    ax.legend(fontsize=8)
    fig.text(0.01, 0.01, note, fontsize=7)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--group", action="append", required=True, metavar="NAME=DEV[,DEV]:HELD[,HELD]",
                    help="a workload: its dev traces (tuning only) and held-out traces (the table); repeatable")
    ap.add_argument("--out", required=True, help="folder for report.md, cells.json, share.png")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing OUT/report.md")
    ap.add_argument("--sizes", type=float, nargs="+", default=[15, 25, 40], help="cache sizes, %% of expert bytes")
    ap.add_argument("--offline-sizes", type=float, nargs="*", default=[40],
                    help="sizes at which the best offline schedule is computed (slow: pure Python)")
    ap.add_argument("--lp-window", type=int, default=2, help="LP bound windows in forwards (0: no bound)")
    ap.add_argument("--lp-all", action="store_true", help="the LP bound on every trace (default: each group's first)")
    ap.add_argument("--planner-us", type=float, default=20.0, help="planner host time per layer access, us")
    ap.add_argument("--as-model", default="llada2.0-mini", choices=sorted(MODEL_SHAPES))
    ap.add_argument("--warmup-sequences", type=int, default=1)
    ap.add_argument("--systems", nargs="+", default=list(SYSTEMS), help="report systems in the table")
    ap.add_argument("--ours", default="learned", help="the system whose captured share is reported")
    args = ap.parse_args(argv)
    try:
        groups = [parse_group(g) for g in args.group]
        known = {s.name: s for s in rp.SYSTEMS}
        bad = [s for s in args.systems if s not in known]
        if bad or args.ours not in args.systems or "oled" not in args.systems:
            raise ValueError(f"--systems {' '.join(args.systems)}: each must be a report system ({', '.join(known)}), "
                             f"with --ours ({args.ours}) and oled among them")
        if any(not 0 < s <= 100 for s in args.sizes) or not set(args.offline_sizes) <= set(args.sizes):
            raise ValueError("--sizes must be in (0, 100] and --offline-sizes among them")
        if not (math.isfinite(args.planner_us) and args.planner_us >= 0) or args.lp_window < 0:
            raise ValueError("--planner-us must be >= 0 and --lp-window >= 0")
        out = Path(args.out)
        if (out / "report.md").exists() and not args.overwrite:
            raise ValueError(f"--out {out}: report.md exists; pass --overwrite to replace it")
    except ValueError as exc:
        print(f"learned_retention.py: error: {exc}", file=sys.stderr)
        return 2
    args.as_model_default = args.as_model
    for k in ("hidden_size", "moe_intermediate_size", "dtype_bytes", "gpu_kernel"):
        setattr(args, k, None if k != "gpu_kernel" else "grouped")
    specs = [known[s] for s in args.systems]
    planner = args.planner_us * 1e-6
    out.mkdir(parents=True, exist_ok=True)
    sections = ["# Learned retention against the Belady rung, on held-out traces",
                f"Command: `python eval/learned_retention.py {' '.join(sys.argv[1:] if argv is None else argv)}`\n\n"
                f"Simulated: LLaDA2.0-mini's experts (a `--like` trace: its model's) on H200 + PCIe 5, planner "
                f"{args.planner_us:g} us per layer access charged to every system, the Belady rung and the offline "
                "schedules alike. Every system tuned on its group's dev traces only (at most "
                f"{rp.TUNING_BUDGET} settings, mean x fused at 15/25/40%). Share = log(best fixed / {args.ours}) / "
                "log(best fixed / Belady rung), where best fixed is the fastest other system of the table at that "
                "cell (`oled_hf/sim/capture.py`)."]
    all_cells = []
    for name, devs, helds in groups:
        tuned, cells = run_group(name, devs, helds, args, specs, planner, not args.lp_all)
        all_cells += cells
        grid = "\n".join(f"- {k}: chosen {v[0] or 'defaults'}; searched " + "; ".join(
            f"{g or 'defaults'}: {x:.3f}" for g, x in v[1]) for k, v in tuned.items())
        sections.append(f"## {name}\nDev: {', '.join(f'`{Path(p).name}`' for p in devs)}; held-out: "
                        f"{', '.join(f'`{Path(p).name}`' for p in helds)}.\n\n{grid}\n\n"
                        + ratio_table(cells, args.systems, args.sizes) + "\n\nTargets:\n"
                        + "\n".join(target_lines(cells)))
    share_plot(all_cells, out / "share.png", f"simulated, planner {args.planner_us:g} us/access; held-out traces")
    sections.append("![share captured](share.png)")
    cells_json = json.dumps([{**dataclasses.asdict(c), "share": c.share} for c in all_cells], indent=1)
    write_atomically(lambda tmp: Path(tmp).write_text(cells_json), out / "cells.json")
    rp.write_markdown(out / "report.md", sections)
    log(f"wrote {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
