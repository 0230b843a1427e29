"""What the ``previous`` prefetch part adds: oled and lru-full with and without it, beside HybriMoE.

Every system tuned as the report tunes it (``report.tune`` on ``--dev``, the deep toy's dev trace by
default: oled and lru-full choose ``reuse_copies=1``, HybriMoE ``decay=0.5, limit=4``), timed as
LLaDA2.0-mini on H200 + PCIe 5 (planner 20 us per layer access, one warm-up sequence). A system with the
``previous`` part is charged ``--prefetch-us`` more per layer access for its prefetch decision (6 us
measured here: the residency copy and the ranking of 256 experts; replay with a fixed planner time charges
a prefetcher nothing). Printed: each system's TPOT over ``oled+previous``'s at each size (above 1: slower).

    .venv/bin/python eval/prefetch_previous.py traces/held-out/deep-b16-bs1.trace traces/held-out/mini-like-s11.trace
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from oled_hf.offload.costmodel import CostModel
from oled_hf.offload.trace import load_trace
from oled_hf.sim.replay import replay
from oled_hf.sim.report import HEADLINE_PCT, SYSTEMS, md_table, slots_for, tune

NAMES = ("oled", "lru-full", "hybrimoe")


def systems(tuned: dict[str, dict]):
    for spec in (s for s in SYSTEMS if s.name in NAMES):
        base = spec.system(tuned[spec.name])
        yield spec.name, base
        if base.prefetch == "none":
            yield f"{spec.name} + previous", dataclasses.replace(base, prefetch="previous")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("traces", nargs="+")
    p.add_argument("--dev", default="traces/dev/deep-b16-bs1.trace", help="the dev trace every system is tuned on")
    p.add_argument("--prefetch-us", type=float, default=6.0,
                   help="host time of the prefetch decision per layer access, added to the 20 us planner time")
    args = p.parse_args()
    if not args.prefetch_us >= 0:
        p.error(f"--prefetch-us={args.prefetch_us} must be >= 0")
    cm = CostModel.h200_pcie5(2048, 512, kernel="grouped")
    tuned = {name: knobs for name, (knobs, _) in tune(load_trace(args.dev), [s for s in SYSTEMS if s.name in NAMES],
                                                        cm, 20e-6, warmup_sequences=1).items()}
    print(f"tuned on {args.dev}: {tuned}", flush=True)
    for path in args.traces:
        trace = load_trace(path)
        tpot = {name: [replay(trace, name, slots_for(pct, trace.num_experts), system=system, cost_model=cm,
                              planner_s=(20 + (args.prefetch_us if system.prefetch == "previous" else 0)) * 1e-6,
                              warmup_sequences=1).tpot_s for pct in HEADLINE_PCT]
                for name, system in systems(tuned)}
        ref = tpot["oled + previous"]
        print(f"\n{Path(path).name}: TPOT / oled + previous's at " + " / ".join(f"{p:g}%" for p in HEADLINE_PCT))
        print(md_table(["system"] + [f"{p:g}%" for p in HEADLINE_PCT],
                       [[name] + [f"{a / b:.3f}" for a, b in zip(xs, ref)] for name, xs in tpot.items()]), flush=True)


if __name__ == "__main__":
    main()
