"""Where layer-adaptive allocation starts to pay: the mini-like workload with layers that differ (issue 38.2).

    .venv/bin/python eval/layer_heterogeneity.py --dev traces/dev/deep-b16-bs1.trace --png eval/layer_heterogeneity.png

Per-layer profile (an ASSUMPTION, printed): LLaDA2.0-mini's per-layer activation ratios (the OLED-MoE paper's
Figure 10c) are not readable as numbers here, so the profile is the deep toy's: distinct experts per step of each
of its MoE layers on ``--dev`` (``routing_stats``), divided by their mean and linearly interpolated to mini's 19
layers. Its popularity skew (top-10% share) and decoded-token persistence per layer are printed beside it
(measured, not swept). Heterogeneity h scales the profile's deviation: layer l routes ``69.5 * (1 + h (r_l - 1))``
distinct experts per step (clamped to [top-k, experts]); h = 0 is ``--like llada2.0-mini`` (every layer alike),
h = 1 the deep toy's own spread, larger h more. Each layer's logit scale is solved for its distinct experts
(``synth_fit.route_stats``, the same routing model ``like`` calibrates with; static share, block carry and
persistence as ``like``). Per h: one timed trace (seed 2, decoder calibrated to 3.5 tokens per forward; no
system is tuned, each runs its first grid setting, so no dev trace is needed); oled and lru-full replay with
layer-adaptive and with uniform allocation at ``--pcts``, timed as
LLaDA2.0-mini on H200 + PCIe 5.0 (simulated). Prints the table; draws adaptive / uniform TPOT against h.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a clone without installing
    sys.path.insert(0, str(ROOT))

from oled_hf.sim import report as rp  # noqa: E402
from oled_hf.sim import synth_fit as sf  # noqa: E402
from oled_hf.sim.synth_like import TOY, calibrate_decoder, like  # noqa: E402
from oled_hf.sim.synthetic import SynthParams, TraceShape, generate  # noqa: E402

SYSTEMS = (
    rp.ReportSystem("oled adaptive", "oled+cpu+reuse+adaptive", "oled, layer-adaptive allocation"),
    rp.ReportSystem("oled uniform", "oled+cpu+reuse+uniform", "oled, uniform allocation"),
    rp.ReportSystem("lru-full adaptive", "lru+cpu+reuse+adaptive", "lru-full, layer-adaptive allocation"),
    rp.ReportSystem("lru-full uniform", "lru+cpu+reuse+uniform", "lru-full, uniform allocation"),
)


def toy_profile(dev_path: str, layers: int) -> dict[str, list[float]]:
    """The deep toy's per-layer figures on ``dev_path``, interpolated to ``layers`` layers (activation ratio
    relative to the layer mean; skew and persistence as measured)."""
    from oled_hf.offload.trace import load_trace

    trace = load_trace(dev_path)
    d = sf.describe(trace)
    distinct = np.asarray(d["distinct experts per iteration"], dtype=float)
    skew = np.asarray(d["top-10% expert share (skew)"], dtype=float)
    stats = sf.routing_stats(trace).summary()["persistence_by_state"]["decoded"]["per_layer"]
    pers = np.asarray([np.nan if v is None else v for v in stats], dtype=float)
    src = np.linspace(0, 1, len(distinct))
    dst = np.linspace(0, 1, layers)
    return {"ratio": list(np.interp(dst, src, distinct / distinct.mean())), "skew": list(np.interp(dst, src, skew)),
            "persistence": list(np.interp(dst, src, pers)), "source_layers": [len(distinct)]}


def scale_table(E: int, k: int, B: int, phi: float, rho: float) -> tuple[np.ndarray, np.ndarray]:
    """Distinct experts per step against the shared logit scale t (decreasing), for inversion."""
    ts = np.linspace(0.0, 6.0, 49)
    return ts, np.asarray([sf.route_stats(t * math.sqrt(phi), t * math.sqrt(1 - phi), rho, E, k, B, n_seq=20)[0]
                           for t in ts])


def heterogeneous(base: SynthParams, ratio: list[float], h: float, table) -> tuple[SynthParams, list[float]]:
    """``base`` with layer l's scale set so it routes 69.5 (1 + h (r_l - 1)) distinct experts per step."""
    ts, dist = table
    phi = TOY["static_share"]
    target = float(base.targets["distinct_per_step"])
    want = [float(np.clip(target * (1 + h * (r - 1)), base.top_k, base.num_experts * 0.98)) for r in ratio]
    t = [float(np.interp(w, dist[::-1], ts[::-1])) for w in want]
    p = SynthParams(**{**base.__dict__, "popularity_scale": [x * math.sqrt(phi) for x in t],
                       "block_scale": [x * math.sqrt(1 - phi) for x in t], "assumptions": list(base.assumptions),
                       "targets": dict(base.targets)})
    return p, want


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dev", required=True, help="the deep toy's dev trace (the per-layer profile's source)")
    p.add_argument("--png", required=True, help="figure to write")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --png")
    p.add_argument("--het", nargs="+", type=float, default=[0.0, 1.0, 2.0, 3.0], help="heterogeneity points h")
    p.add_argument("--pcts", nargs="+", type=float, default=[25.0, 40.0], help="cache sizes (default 25 40)")
    p.add_argument("--sequences", type=int, default=7, help="sequences per timed trace (1 warm-up; default 7)")
    p.add_argument("--blocks", type=int, default=3, help="blocks per sequence (default 3)")
    p.add_argument("--planner-us", type=float, default=20.0, help="planner us per access (default 20)")
    args = p.parse_args(argv)
    from oled_hf.fileio import check_new_file, write_atomically

    try:
        check_new_file(args.png, overwrite=args.overwrite, field="--png", flag="--overwrite")
        if not Path(args.dev).is_file():
            raise ValueError(f"--dev {args.dev}: no such file")
        if args.sequences < 2 or args.blocks < 1 or any(h < 0 for h in args.het):
            raise ValueError("--sequences needs at least 2, --blocks at least 1, --het values >= 0")
    except ValueError as exc:
        print(f"layer_heterogeneity: {exc}", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(1)
    base = like("llada2.0-mini")
    prof = toy_profile(args.dev, base.num_layers)
    print(f"# Layer heterogeneity (mini-like, {base.num_layers} MoE layers x {base.num_experts}, block "
          f"{base.block_length}; simulated time: LLaDA2.0-mini on H200 + PCIe 5.0)\n")
    print(f"per-layer profile: ASSUMED, the deep toy's {prof['source_layers'][0]} MoE layers on {args.dev} "
          f"interpolated to {base.num_layers} (mini's Figure 10c values are not readable here)")
    print("  activation ratio / mean: " + " ".join(f"{x:.2f}" for x in prof["ratio"]))
    print("  popularity skew (top-10% share, measured, not swept): " + " ".join(f"{x:.2f}" for x in prof["skew"]))
    print("  persistence of decoded tokens (measured, not swept): " + " ".join(f"{x:.2f}" for x in prof["persistence"]))
    table = scale_table(base.num_experts, base.top_k, base.block_length, TOY["static_share"], TOY["block_carry"])
    shape = TraceShape.uniform(args.sequences, args.blocks, base.block_length, prompt_length=base.block_length)
    rows = []
    for h in args.het:
        params, want = heterogeneous(base, prof["ratio"], h, table)
        calibrate_decoder(params, shape, 2)
        held = generate(params, shape, seed=2)
        got = sf.describe(held)["distinct experts per iteration"]
        runs = rp.run_systems(held, f"h{h:g}", SYSTEMS, args.pcts, _cost(held), args.planner_us * 1e-6, bounds=False,
                              warmup_sequences=1, tuned={})
        rows.append((h, want, got, runs))
        print(f"[h {h:g}] distinct per layer wanted {min(want):.0f}-{max(want):.0f}, got "
              f"{min(got):.0f}-{max(got):.0f}; " + "; ".join(
                  f"{s.name} {pct:g}% {rp.pick(runs, s.name, pct).result.ratio_to_full:.3f}"
                  for pct in args.pcts for s in SYSTEMS), flush=True)
    print("\n| h | distinct per step, min-max over layers | " + " | ".join(
        f"{r} {pct:g}%: adaptive / uniform" for pct in args.pcts for r in ("oled", "lru-full")) + " |")
    print("|" + "---|" * (2 + 2 * len(args.pcts)))
    gains = {}
    for h, _, got, runs in rows:
        cells = []
        for pct in args.pcts:
            for r in ("oled", "lru-full"):
                a = rp.pick(runs, f"{r} adaptive", pct).result.ratio_to_full
                u = rp.pick(runs, f"{r} uniform", pct).result.ratio_to_full
                gains.setdefault((r, pct), []).append(u / a)
                cells.append(f"{a:.3f} / {u:.3f} ({u / a:.3f}x)")
        print(f"| {h:g} | {min(got):.0f}-{max(got):.0f} | " + " | ".join(cells) + " |")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (r, pct), g in gains.items():
        ax.plot(args.het, g, marker="o", label=f"{r}, {pct:g}% cache")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("layer heterogeneity h (0: every layer alike; 1: the deep toy's spread; assumed profile)")
    ax.set_ylabel("TPOT uniform / TPOT layer-adaptive")
    ax.set_title("Where layer-adaptive allocation pays (mini-like, simulated)")
    fig.text(0.01, 0.005, "simulated time: LLaDA2.0-mini-sized experts on H200 + PCIe 5.0; synthetic traces, "
                          f"{base.num_layers} MoE layers x 256, block 32, {args.sequences - 1} timed sequences",
             fontsize=7)
    ax.legend(fontsize=8)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    write_atomically(lambda tmp: fig.savefig(tmp, dpi=120, format="png"), args.png)
    print(f"\nwrote {args.png}")
    return 0


def _cost(trace):
    from oled_hf.sim.hardware import cost_model_from_args

    return cost_model_from_args(trace, argparse.Namespace(as_model="llada2.0-mini"))


if __name__ == "__main__":
    raise SystemExit(main())
