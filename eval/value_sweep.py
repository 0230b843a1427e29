"""Issue 36 (2): judge retention/admission candidates against the baselines, tuned alike on dev.

Every system gets the same tuning budget (at most ``TUNING_BUDGET`` knob settings, the grid of its
row), chosen by mean TPOT / fused residency over 15/25/40 % on the dev traces only; the held-out
traces are then replayed once per system with its chosen setting. Timed as LLaDA2.0-mini's experts
on H200 + PCIe 5 (grouped GPU kernel), planner host time a stated constant per access (so that runs
are deterministic and comparable on a shared box), the first recorded sequence as warm-up.

    .venv/bin/python eval/value_sweep.py --dev traces/dev/*.trace --held-out traces/held-out/*.trace \
        [--systems oled lru-full ...] [--host-dram-gbps 100] [--cpu-scale 2] [--pcie-scale 0.5]

Prints one table per split: x fused per system and size, and each system's ratio to ``--ours``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from oled_hf.fileio import check_new_file, write_atomically
from oled_hf.offload.costmodel import CostModel
from oled_hf.offload.system import parse_system
from oled_hf.offload.trace import load_trace
from oled_hf.sim.hardware import MODEL_SHAPES
from oled_hf.sim.replay import replay
from oled_hf.sim.report import HEADLINE_PCT, TUNING_BUDGET, slots_for

_REUSE = [{"dispatch.reuse_copies": n} for n in (1, 2, 4, 8)]
# name -> (system string, tuning grid); the baselines' grids are the report's (oled_hf/sim/report.py)
CANDIDATES: dict[str, tuple[str, list[dict[str, Any]]]] = {
    "oled": ("oled", _REUSE),
    "lru-full": ("lru-full", _REUSE),
    "lfu-full": ("lfu-full", _REUSE),
    "hybrimoe": ("hybrimoe", [{"retention.decay": d, "prefetch.limit": n} for d in (0.5, 0.9) for n in (4, 16)]),
    "tide": ("tide", [{"retention.interval": t} for t in (1, 2, 4, 8)]),
    # candidates (issue 36, deliverable 2)
    "oled-freq": ("oled", [{"retention.freq_weight": w, "dispatch.reuse_copies": n}
                           for w in (1.0, 4.0) for n in (2, 4)]),
    "score-full": ("score+cpu+reuse+adaptive",
                   [{"retention.decay": d, "dispatch.reuse_copies": n} for d in (0.5, 0.9) for n in (2, 4)]),
    "value": ("value+cpu+reuse+adaptive",
              [{"retention.decay": d, "dispatch.reuse_copies": n} for d in (0.8, 0.95) for n in (2, 4)]),
    "value-conf": ("value+cpu+reuse+adaptive", [{"retention.decay": d, "retention.confidence_weight": 0.5,
                                                 "dispatch.reuse_copies": n} for d in (0.8, 0.95) for n in (2, 4)]),
    "value-amort": ("value+cpu+adaptive", [{"retention.decay": d} for d in (0.7, 0.8, 0.9, 0.95)]),
    "mix": ("mix+cpu+reuse+adaptive", [{"retention.eta": e, "retention.value_decay": d}
                                       for e in (2.0, 8.0) for d in (0.9, 0.97)]),
    "oled-dram": ("oled", [{"dispatch.reuse_copies": n, "dispatch.shared_dram": True} for n in (1, 2, 4, 8)]),
    "value-admit": ("value+cpu+reuse+adaptive", [{"retention.decay": d, "dispatch.admit": True}
                                                 for d in (0.8, 0.9, 0.95, 0.99)]),
    # engineer R1: horizon-calibrated reuse (policies/horizon.py) under the amortised split, and its
    # admission floor under the myopic split with reuse copies
    "horizon-amort": ("horizon+cpu+adaptive", [{"retention.base": b, "retention.discount": d}
                                               for b in ("lru", "oled") for d in (0.1, 0.25)]),
    "horizon-reuse": ("horizon+cpu+reuse+adaptive",
                      [{"retention.base": "oled", "retention.admit_min": a, "dispatch.reuse_copies": 1}
                       for a in (0.0, 0.1, 0.3, 0.5)]),
}


def cost_model(trace, host_dram_gbps: float | None) -> CostModel:
    hidden, inter, dtype = MODEL_SHAPES["llada2.0-mini"]
    kw = {} if host_dram_gbps is None else {"host_dram_gbps": host_dram_gbps}
    return CostModel.h200_pcie5(hidden, inter, dtype, kernel="grouped", **kw)


def run(trace, parts: str, knobs: dict[str, Any], pct: float, cm: CostModel, believed: CostModel | None,
        planner_s: float, warm: int):
    system = parse_system(parts).with_knobs(**{k.replace(".", "__", 1): v for k, v in knobs.items()})
    return replay(trace, parts, slots_for(pct, trace.num_experts), system=system, cost_model=cm,
                  planner_s=planner_s, warmup_sequences=warm, believed=believed)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dev", nargs="+", required=True)
    p.add_argument("--held-out", nargs="*", default=[])
    p.add_argument("--systems", nargs="+", default=list(CANDIDATES))
    p.add_argument("--ours", default="oled")
    p.add_argument("--pcts", nargs="+", type=float, default=list(HEADLINE_PCT))
    p.add_argument("--planner-us", type=float, default=25.0)
    p.add_argument("--warmup-sequences", type=int, default=1)
    p.add_argument("--host-dram-gbps", type=float, default=None)
    p.add_argument("--cpu-scale", type=float, default=1.0, help="believed CPU speed / true")
    p.add_argument("--pcie-scale", type=float, default=1.0, help="believed PCIe bandwidth / true")
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument("--knobs", nargs="*", default=[], metavar="NAME=JSON",
                   help="skip tuning NAME: use these knobs (chosen on the same dev traces by an earlier run)")
    args = p.parse_args(argv)
    for s in args.systems:
        if s not in CANDIDATES:
            p.error(f"--systems: {s!r} is unknown; known: {', '.join(CANDIDATES)}")
        if len(CANDIDATES[s][1]) > TUNING_BUDGET:
            p.error(f"{s} searches more than {TUNING_BUDGET} settings")
    planner = args.planner_us * 1e-6
    json_path = check_new_file(args.json, overwrite=True, field="--json") if args.json else None

    def loaded(paths):
        out = []
        for path in paths:
            t = load_trace(path)
            cm = cost_model(t, args.host_dram_gbps)
            bel = cm.believed(args.cpu_scale, args.pcie_scale)
            n_seq = len(np.unique(t.arrays["fwd_seq"]))
            out.append((path, t, cm, None if bel is cm else bel, min(args.warmup_sequences, n_seq - 1)))
        return out

    dev, held = loaded(args.dev), loaded(args.held_out)
    chosen: dict[str, dict[str, Any]] = {}
    for item in args.knobs:
        name, _, text = item.partition("=")
        if name not in args.systems:
            p.error(f"--knobs {item!r}: {name!r} is not one of --systems")
        try:
            chosen[name] = json.loads(text)
        except json.JSONDecodeError as exc:
            p.error(f"--knobs {item!r}: not JSON ({exc})")
    t0 = time.time()
    for s in args.systems:
        parts, grid = CANDIDATES[s]
        if s in chosen:
            print(f"tuned {s} earlier: {chosen[s]}", file=sys.stderr)
            continue
        scores = []
        for knobs in grid:
            xs = [run(t, parts, knobs, pct, cm, bel, planner, w).ratio_to_full
                  for _, t, cm, bel, w in dev for pct in args.pcts]
            scores.append((float(np.mean(xs)), knobs))
        chosen[s] = min(scores, key=lambda sk: sk[0])[1]
        print(f"[{time.time() - t0:.0f} s] tuned {s}: {chosen[s]} "
              f"({'; '.join(f'{k}: {x:.3f}' for x, k in scores)})", file=sys.stderr, flush=True)
    figures: dict[str, Any] = {"chosen": chosen, "args": vars(args), "splits": {}}
    for split, traces in (("dev", dev), ("held-out", held)):
        if not traces:
            continue
        table: dict[str, dict[str, list[float]]] = {}
        for _, t, cm, bel, w in traces:
            for pct in args.pcts:
                for s in args.systems:
                    r = run(t, CANDIDATES[s][0], chosen[s], pct, cm, bel, planner, w)
                    table.setdefault(s, {}).setdefault(f"{pct:g}", []).append(r.ratio_to_full)
        figures["splits"][split] = table
        print(f"\n{split} ({len(traces)} traces): mean x fused [min-max over traces]; ratio = system / {args.ours}")
        print("| system | " + " | ".join(f"{p:g}% x fused | ratio" for p in args.pcts) + " |")
        print("|---|" + "---|---|" * len(args.pcts))
        ours = table.get(args.ours)
        for s in args.systems:
            cells = []
            for pct in args.pcts:
                xs = np.array(table[s][f"{pct:g}"])
                ratio = np.mean(xs / np.array(ours[f"{pct:g}"])) if ours else float("nan")
                cells.append(f"{xs.mean():.3f} [{xs.min():.2f}-{xs.max():.2f}] | {ratio:.3f}")
            print(f"| {s} | " + " | ".join(cells) + " |")
    if args.json:
        text = json.dumps(figures, indent=1, default=str)
        write_atomically(lambda tmp: Path(tmp).write_text(text), json_path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
