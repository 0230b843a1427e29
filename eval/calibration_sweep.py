"""Issue 36.3: TPOT under a wrong starting belief, with and without online calibration, vs the true belief.

For each trace, cache size and wrong belief (``--beliefs``: believed CPU speed / true and believed
PCIe bandwidth / true), every system is replayed three ways: deciding from the wrong belief, from
the wrong belief calibrated online (dispatch knob ``calibrate=1``; noisy true times, seeded), and
from the true belief. Calibration is a dispatch part, so every system whose dispatch has the CPU
gets it (a copy-only dispatch reads no cost). Timing as the report times it: mini experts on
H200 + PCIe 5 (grouped kernel), the planner a constant 25 us per access (deterministic on a loaded
box), the first sequence as warm-up (so "after the first block" holds: the timed part starts after
at least one block). Replay is deterministic here, so there is nothing to interleave.

Prints the table "believed vs calibrated vs true" (TPOT ms, and wrong / true, calibrated / true),
the learned scales of oled's calibrator, and writes every row as JSON (``--json``).

    .venv/bin/python eval/calibration_sweep.py traces/held-out/deep-b16-bs1.trace /tmp/mini11.trace
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from oled_hf.fileio import check_new_file, write_atomically
from oled_hf.offload.costmodel import CostModel
from oled_hf.offload.system import parse_system
from oled_hf.offload.trace import load_trace
from oled_hf.sim.hardware import MODEL_SHAPES
from oled_hf.sim.replay import replay
from oled_hf.sim.report import slots_for
from oled_hf.sim.report_calibration import calibrated, fmt_scales, format_table

BELIEFS = {"cpu2": (2.0, 1.0), "cpu0.5": (0.5, 1.0), "pcie2": (1.0, 2.0), "pcie0.5": (1.0, 0.5)}
PLANNER_S = 25e-6


def cost_model() -> CostModel:
    hidden, inter, dtype = MODEL_SHAPES["llada2.0-mini"]
    return CostModel.h200_pcie5(hidden, inter, dtype, kernel="grouped")


def run(trace: Any, name: str, pct: float, cm: CostModel, believed: CostModel | None, calibrate: bool,
        sigma: float, seed: int, warm: int) -> tuple[float, dict[str, float] | None]:
    """TPOT (s) of one replay, and the calibrator's final scales (None without calibration)."""
    system = calibrated(parse_system(name)) if calibrate else parse_system(name)
    r = replay(trace, name, slots_for(pct, trace.num_experts), system=system, cost_model=cm, planner_s=PLANNER_S,
               warmup_sequences=warm, believed=believed, measure_sigma=sigma, measure_seed=seed)
    return r.tpot_s, (r.calibration or None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("traces", nargs="+")
    p.add_argument("--systems", nargs="+", default=["oled", "hybrimoe", "lru-full", "tide"])
    p.add_argument("--pct", nargs="+", type=float, default=[15.0, 25.0, 40.0])
    p.add_argument("--beliefs", nargs="+", default=list(BELIEFS), choices=list(BELIEFS))
    p.add_argument("--sigma", type=float, default=0.1, help="log-space noise of the measurements")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup-sequences", type=int, default=1)
    p.add_argument("--json", default=None, help="write every row here (a new file)")
    args = p.parse_args(argv)
    if args.json:
        check_new_file(args.json, overwrite=False, field="--json", flag="a new path")
    cm = cost_model()
    rows: list[dict[str, Any]] = []
    for path in args.traces:
        trace = load_trace(path)
        warm = min(args.warmup_sequences, len(set(trace.arrays["fwd_seq"].tolist())) - 1)
        for pct in args.pct:
            for name in args.systems:
                true_t, _ = run(trace, name, pct, cm, None, False, args.sigma, args.seed, warm)
                for b in args.beliefs:
                    bel = cm.believed(*BELIEFS[b])
                    wrong, _ = run(trace, name, pct, cm, bel, False, args.sigma, args.seed, warm)
                    cal, scales = run(trace, name, pct, cm, bel, True, args.sigma, args.seed, warm)
                    row = {"trace": path, "pct": pct, "system": name, "belief": b, "wrong_ms": 1e3 * wrong,
                           "calibrated_ms": 1e3 * cal, "true_ms": 1e3 * true_t, "scales": scales}
                    rows.append(row)
                    print(f"{path.rsplit('/', 1)[-1]:<22} {pct:>4g}% {name:<9} {b:<8} wrong {1e3 * wrong:8.3f}  "
                          f"cal {1e3 * cal:8.3f}  true {1e3 * true_t:8.3f}  wrong/true {wrong / true_t:6.3f}  "
                          f"cal/true {cal / true_t:6.3f}  scales {fmt_scales(scales)}", flush=True)
    print()
    print(format_table(rows))
    if args.json:
        text = json.dumps(rows, indent=1)

        def save(tmp: str) -> None:
            with open(tmp, "w") as f:
                f.write(text)

        write_atomically(save, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
