"""Bracket the optimum on a trace: the LP lower bound (windows), the greedy offline schedule, and systems.

    .venv/bin/python eval/report/bracket.py TRACE [--sizes 15 25 40] [--window 2] [--coupled-passes P]
        [--dual-steps N | --no-dual] [--decompose] [--max-forwards N]

Prints, per cache size (percent of expert memory): the valid LP bound (``oled_hf/sim/bounds/lp.py``,
windows of ``--window`` forwards, each from a free cache), with ``--coupled-passes P`` also the
coupled bound (``oled_hf/sim/bounds/coupled.py``: the same windows, P passes of Lagrangian prices on
the cache state at their boundaries), the whole-trace dual bound (``oled_hf/sim/bounds/dual.py``: no
windows; ``--dual-steps`` ascent steps from each start) and the largest as the bound the ratios use, the
greedy offline schedules (``oled_hf/sim/schedules/greedy.py``, the best over its reuse credits), replay
with the ``belady`` retention oracle (the whole future; lru-full's dispatch
and pure caching; each charged the planner time), the best of those offline schedules (the upper side of the bracket),
the old MIN bound (``sim/bounds/physical.py``, loose: CPU-served misses enter free)
and oled / lru-full / hybrimoe replayed at the report's dev-tuned knobs, each as x fused and x that bound.
Timed as the report times them: llada2.0-mini's expert size on H200 + PCIe 5, planner 20 us per access,
one warm-up sequence.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from oled_hf.offload.costmodel import CostModel
from oled_hf.offload.trace import load_trace
from oled_hf.sim.bounds import lower_bound
from oled_hf.sim.bounds.dual import DEFAULT_ITERATIONS
from oled_hf.sim.decompose import decompose
from oled_hf.sim.demand import full_time, request_counts, timed_forwards
from oled_hf.sim.ladder import FAIR_BASE
from oled_hf.sim.replay import replay
from oled_hf.sim.report import SYSTEMS, md_table, slots_for
from oled_hf.sim.schedules import offline_schedules

TUNED = {"oled": {"dispatch.reuse_copies": 1}, "lru-full": {"dispatch.reuse_copies": 1},
         "hybrimoe": {"retention.decay": 0.5, "prefetch.limit": 4}}  # eval/report/report.md's dev choices


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--sizes", type=float, nargs="+", default=[15, 25, 40])
    p.add_argument("--window", type=int, default=2, help="forwards per LP window (each starts from a free cache)")
    p.add_argument("--coupled-passes", type=int, default=0,
                   help="also the coupled bound with this many passes (0: off; each costs about two free-cache solves)")
    p.add_argument("--dual-steps", type=int, default=DEFAULT_ITERATIONS,
                   help="ascent steps from each start of the whole-trace dual bound (oled_hf/sim/bounds/dual.py)")
    p.add_argument("--no-dual", action="store_true", help="leave the whole-trace dual bound out")
    p.add_argument("--decompose", action="store_true",
                   help="also decompose oled's time above the LP bound (oled_hf/sim/decompose.py)")
    p.add_argument("--max-forwards", type=int, default=0, help="time only the first N timed forwards (0: all)")
    args = p.parse_args()
    if args.coupled_passes < 0:
        p.error(f"--coupled-passes={args.coupled_passes} must be >= 0")
    if args.dual_steps < 1:
        p.error(f"--dual-steps={args.dual_steps} must be >= 1")
    trace = load_trace(args.trace)
    cm = CostModel.h200_pcie5(2048, 512, kernel="grouped")
    counts = request_counts(trace)
    timed = timed_forwards(trace, 1)
    if args.max_forwards:
        keep = np.flatnonzero(timed)[: args.max_forwards]
        timed = np.zeros_like(timed)
        timed[keep] = True
    full = full_time(counts, timed, cm)
    print(f"{args.trace}: {int(timed.sum())} timed forwards, {trace.num_layers}x{trace.num_experts}, "
          f"fused {1e3 * full:.2f} ms, LP window {args.window} forwards")
    for pct in args.sizes:
        size = slots_for(pct, trace.num_experts)
        total = size * trace.num_layers
        t0 = time.perf_counter()
        lp = lower_bound("lp", trace, cm, total, timed=timed, window_forwards=args.window)
        bound_s, lp_s = lp.time_s, time.perf_counter() - t0
        rows = [("LP bound, free-cache windows", lp.time_s)]
        if args.coupled_passes:
            t0 = time.perf_counter()
            coupled = lower_bound("coupled", trace, cm, total, timed=timed, window_forwards=args.window,
                                  passes=args.coupled_passes)
            lp_s += time.perf_counter() - t0
            rows.append((f"LP bound, coupled ({args.coupled_passes} passes)", coupled.time_s))
            bound_s = max(bound_s, coupled.time_s)
        if not args.no_dual:
            t0 = time.perf_counter()
            dual = lower_bound("dual", trace, cm, total, timed=timed, iterations=args.dual_steps)
            lp_s += time.perf_counter() - t0
            rows.append((f"dual bound, whole trace ({dual.iterations} steps)", dual.time_s))
            bound_s = max(bound_s, dual.time_s)
        rows.append(("valid bound (the larger)", bound_s))
        t0 = time.perf_counter()
        fair = next(s for s in SYSTEMS if s.name == FAIR_BASE).system(TUNED[FAIR_BASE])
        offline = offline_schedules(trace, cm, size, fair, 1, timed if args.max_forwards else None,
                                    planner_s=20e-6)
        gr_s = time.perf_counter() - t0
        old = lower_bound("min", trace, cm, total, 1).ratio_to_full if not args.max_forwards else float("nan")
        rows += offline.rows
        if not args.max_forwards:
            rows.append(("best offline schedule", offline.best_s))
            for spec in SYSTEMS:
                if spec.name in TUNED:
                    system = spec.system(TUNED[spec.name])
                    r = replay(trace, spec.name, size, system=system, cost_model=cm, planner_s=20e-6,
                               warmup_sequences=1)
                    rows.append((spec.name, r.sim_time_s))
        print(f"-- {pct:g}% ({size} slots/layer, {total} total): bounds {lp_s:.0f} s ({len(lp.windows)} windows), "
              f"offline schedules {gr_s:.0f} s; old MIN bound (loose) {old:.2f}x fused")
        for name, t in rows:
            print(f"   {name:26s} {1e3 * t:9.2f} ms  {t / full:6.2f} x fused  {t / bound_s:6.2f} x bound",
                  flush=True)
        if args.decompose and not args.max_forwards:
            d = decompose(trace, next(s for s in SYSTEMS if s.name == "oled").system(TUNED["oled"]), size, cm, 20e-6,
                          bound_s)
            print(md_table(["oled above the LP bound, step", "ms", "share of the gap", "x fused"], d.table(full)),
                  flush=True)


if __name__ == "__main__":
    main()
