"""Each report system's simulated TPOT against routing locality: the generator swept from the toy's to mini's.

    .venv/bin/python eval/locality_sweep.py --png eval/report/locality_sweep.png [--points 5] [--sequences 4]

Workloads: ``synth_like.like("llada2.0-mini", distinct=D, cosine=C)`` (19 MoE layers x 256, top-8, block 32;
every other figure as ``--like llada2.0-mini`` states it), with (D, C) moved in ``--points`` equal steps from the
long-answer toy's fitted locality (0.45 distinct experts per route = 115 of 256 routes per step, activation
cosine 0.90, ``eval/synthetic_validation.py`` on traces/dev/long-b16-bs1.trace) to mini's published one (69.5,
0.985). Per point: a synthetic dev trace (kTransformers' profile) and a held-out trace; every system of
``report.SYSTEMS`` replays the held-out one at 15/25/40% at its first grid setting (no per-point tuning, to keep
the sweep to minutes), timed as LLaDA2.0-mini on H200 + PCIe 5.0 (simulated). Prints a table; draws x fused at
``--pct`` against distinct experts per route.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a clone without installing
    sys.path.insert(0, str(ROOT))

from oled_hf.sim import report as rp  # noqa: E402
from oled_hf.sim import synth_fit as sf  # noqa: E402
from oled_hf.sim.hardware import cost_model_from_args  # noqa: E402
from oled_hf.sim.synth_like import like  # noqa: E402
from oled_hf.sim.synthetic import TraceShape, generate  # noqa: E402

TOY = (115.0, 0.90)  # distinct experts per 256-route step (0.45 per route) and cosine of the long-answer toy
MINI = (69.5, 0.985)


def sweep_points(n: int) -> list[tuple[float, float]]:
    return [(TOY[0] + t * (MINI[0] - TOY[0]), TOY[1] + t * (MINI[1] - TOY[1])) for t in np.linspace(0, 1, n)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--png", required=True, help="figure to write")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --png")
    p.add_argument("--points", type=int, default=5, help="locality points from the toy's to mini's")
    p.add_argument("--sequences", type=int, default=4, help="sequences per held-out trace (the first warms up)")
    p.add_argument("--blocks", type=int, default=4, help="blocks per sequence")
    p.add_argument("--layers", type=int, default=19, help="MoE layers (mini: 19; fewer runs faster)")
    p.add_argument("--pct", type=float, default=25, choices=rp.HEADLINE_PCT, help="cache size of the figure")
    p.add_argument("--planner-us", type=float, default=None, help="planner us per access (default: measured)")
    args = p.parse_args(argv)
    if Path(args.png).exists() and not args.overwrite:
        print(f"locality_sweep: --png {args.png}: exists; pass --overwrite to replace it", file=sys.stderr)
        return 2
    if args.points < 2:
        print(f"locality_sweep: --points {args.points}: need at least 2", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(1)
    names = [s.name for s in rp.SYSTEMS]
    planner = None if args.planner_us is None else args.planner_us * 1e-6
    rows = []
    for distinct, cosine in sweep_points(args.points):
        params = like("llada2.0-mini", distinct=distinct, cosine=cosine)
        params.num_layers = args.layers
        for key in ("popularity_scale", "block_scale", "block_carry", "predict_carry"):
            setattr(params, key, getattr(params, key)[: args.layers])
        params.carry = {k: v[: args.layers] for k, v in params.carry.items()}
        shape = TraceShape.uniform(args.sequences, args.blocks, params.block_length, prompt_length=32)
        dev, held = generate(params, shape, seed=1), generate(params, shape, seed=2)
        stats = sf.describe(held)
        per_route = float(np.mean(stats["distinct experts per iteration"])) / (params.block_length * params.top_k)
        cost = cost_model_from_args(held, argparse.Namespace(as_model="llada2.0-mini"))
        runs = rp.run_systems(held, "sweep", rp.SYSTEMS, rp.HEADLINE_PCT, cost, planner, bounds=False,
                              warmup_sequences=1, tuned={}, profile=rp.dev_profile(dev))
        rows.append((per_route, float(stats["activation cosine within block"]), runs))
        print(f"[sweep] {per_route:.3f} distinct per route, cosine {rows[-1][1]:.3f}", flush=True)
    head = ["system"] + [f"{r[0]:.2f}/{r[1]:.3f}" for r in rows]
    print(f"\nsimulated TPOT / fused (x fused), LLaDA2.0-mini-sized experts on H200 + PCIe 5.0; columns: distinct "
          f"experts per route / activation cosine (toy-like -> mini-like); {args.layers} MoE layers x 256, block 32")
    for pct in rp.HEADLINE_PCT:
        body = [[n] + [f"{rp.pick(r[2], n, pct).result.ratio_to_full:.2f}" if rp.pick(r[2], n, pct) else "-"
                       for r in rows] for n in names]
        print(f"\n### {pct:g}%\n" + rp.md_table(head, body))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    xs = [r[0] for r in rows]
    for n in names:
        ys = [rp.pick(r[2], n, args.pct).result.ratio_to_full if rp.pick(r[2], n, args.pct) else np.nan
              for r in rows]
        ax.plot(xs, ys, marker="o", label=n, linewidth=2.5 if n == rp.OURS else 1.2)
    ax.set_xlabel("distinct experts per route (toy-like left -> mini-like right)")
    ax.invert_xaxis()
    ax.set_ylabel(f"simulated TPOT / fused residency at {args.pct:g}% cache")
    ax.set_yscale("log")
    ax.set_title("Systems against routing locality (synthetic workloads)")
    fig.text(0.01, 0.005, f"simulated time: LLaDA2.0-mini-sized experts on H200 + PCIe 5.0; synthetic traces, "
                        f"{args.layers} MoE layers x 256, block 32; cosine {rows[0][1]:.3f} -> {rows[-1][1]:.3f}",
             fontsize=7)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(args.png, dpi=120)
    print(f"\nwrote {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
