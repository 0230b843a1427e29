"""Is the synthetic workload a stand-in for a recorded one? Fit on dev, compare every system on held-out.

    .venv/bin/python eval/synthetic_validation.py --dev traces/dev/long-b16-bs1.trace \\
        --held-out traces/held-out/long-b16-bs1.trace [--as-model llada2.0-mini] [--planner-us 2]

1. ``synth_fit.fit`` estimates the generator's parameters on the dev trace (or ``--params`` loads them);
   the statistics of the dev trace are printed next to those of a trace regenerated with its shape.
2. Two worlds, each tuned and replayed as ``oled-moe report`` does (every system of ``report.SYSTEMS``
   tuned on its dev split, kTransformers' placement profiled there, ``--warmup-sequences`` untimed):
   *recorded*: tuned on the dev trace, replayed on the held-out trace;
   *synthetic*: tuned on a synthetic dev trace (the dev trace's shape), replayed on a synthetic held-out trace
   with the held-out trace's shape (its sequences, prompt rows, blocks and masked positions per block; the
   commit schedule and routing come from the fitted parameters). Both synthetic traces share the fitted
   static popularity, as a model's dev and held-out traces share its experts.
3. Per system and cache size (15/25/40%): simulated TPOT / fused residency in both worlds, the relative error,
   whether it is within the tolerance (10%), and per size whether the systems rank in the same order
   (Kendall tau, and the identity of the fastest system).

Simulated time throughout (H200 + PCIe 5.0, expert size of ``--as-model``); nothing here runs a model.
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
from oled_hf.sim.hardware import add_cost_model_args, cost_model_from_args, planner_seconds  # noqa: E402
from oled_hf.sim.synthetic import SynthParams, generate  # noqa: E402
from oled_hf.sim.trace import Trace, load_trace  # noqa: E402

TOLERANCE = 0.10


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-b of two score lists (1 = same order)."""
    from scipy.stats import kendalltau

    return float(kendalltau(a, b).statistic)


def world(dev: Trace, held: Trace, cost_dev, cost_held, planner, warmup: int, systems=rp.SYSTEMS):
    """Tune every system on ``dev``, replay on ``held`` at the headline sizes: (runs, chosen knobs)."""
    n_dev = len(set(dev.arrays["fwd_seq"].tolist()))
    n_held = len(set(held.arrays["fwd_seq"].tolist()))
    profile = rp.dev_profile(dev)
    tuned = {name: knobs for name, (knobs, _) in rp.tune(dev, systems, cost_dev, planner, min(warmup, n_dev - 1),
                                                         profile=profile).items()}
    runs = rp.run_systems(held, "held", systems, rp.HEADLINE_PCT, cost_held, planner, bounds=False,
                          warmup_sequences=min(warmup, n_held - 1), tuned=tuned, profile=profile)
    return runs, tuned


def validation_rows(real_runs, syn_runs, names, pcts=rp.HEADLINE_PCT, tol=TOLERANCE):
    """Per system: [(real, synthetic, relative error, within)] per size; per size: (tau, same order, fastest)."""
    rows, orders = {}, {}
    for name in names:
        cells = []
        for p in pcts:
            r, s = rp.pick(real_runs, name, p), rp.pick(syn_runs, name, p)
            if r is None or s is None:
                cells.append(None)
                continue
            x, y = r.result.ratio_to_full, s.result.ratio_to_full
            err = (y - x) / x
            cells.append((x, y, err, abs(err) <= tol))
        rows[name] = cells
    for j, p in enumerate(pcts):
        both = [n for n in names if rows[n][j] is not None]
        real = [rows[n][j][0] for n in both]
        syn = [rows[n][j][1] for n in both]
        rank_r = [both[i] for i in np.argsort(real, kind="stable")]
        rank_s = [both[i] for i in np.argsort(syn, kind="stable")]
        orders[p] = (kendall_tau(real, syn), rank_r == rank_s, rank_r[0], rank_s[0], rank_r, rank_s)
    return rows, orders


def format_validation(rows, orders, pcts=rp.HEADLINE_PCT, tol=TOLERANCE) -> str:
    head = ["system"] + [f"{p:g}%: recorded / synthetic (error)" for p in pcts]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, cells in rows.items():
        out = [name]
        for c in cells:
            out.append("-" if c is None else
                       f"{c[0]:.3f} / {c[1]:.3f} ({c[2]:+.1%}{'' if c[3] else ' MISS'})")
        lines.append("| " + " | ".join(out) + " |")
    ok = sum(c[3] for cells in rows.values() for c in cells if c is not None)
    total = sum(c is not None for cells in rows.values() for c in cells)
    lines.append("")
    lines.append(f"within +-{tol:.0%}: {ok}/{total} system-size pairs; largest error "
                 f"{max(abs(c[2]) for cells in rows.values() for c in cells if c is not None):.1%}")
    for p in pcts:
        tau, same, fr, fs, rank_r, rank_s = orders[p]
        lines.append(f"{p:g}%: Kendall tau {tau:.3f}; same order: {'yes' if same else 'no'}; fastest recorded "
                     f"{fr}, synthetic {fs}{'' if fr == fs else ' (DIFFERENT)'}")
        if not same:
            lines.append(f"    recorded : {' < '.join(rank_r)}")
            lines.append(f"    synthetic: {' < '.join(rank_s)}")
    return "\n".join(lines)


def _check(args: argparse.Namespace) -> None:
    for flag, path in (("--dev", args.dev), ("--held-out", args.held_out), ("--params", args.params)):
        if path is not None and not Path(path).is_file():
            raise ValueError(f"{flag} {path}: no such file")
    if args.save_params and Path(args.save_params).exists() and not args.overwrite:
        raise ValueError(f"--save-params {args.save_params}: exists; pass --overwrite to replace it")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dev", required=True, help="recorded dev trace: the fit and the recorded world's tuning")
    p.add_argument("--held-out", required=True, help="recorded held-out trace of the same model")
    p.add_argument("--params", default=None, help="fitted parameters (JSON) instead of fitting on --dev")
    p.add_argument("--save-params", default=None, help="write the fitted parameters (JSON) here")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --save-params file")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic traces")
    p.add_argument("--tune-on", choices=["synthetic", "recorded"], default="synthetic",
                   help="where the synthetic world's knobs and kTransformers' profile come from (default: its own "
                        "synthetic dev trace, as for a model without recorded traces)")
    p.add_argument("--warmup-sequences", type=int, default=1, help="untimed warm-up sequences (as the report)")
    add_cost_model_args(p)
    args = p.parse_args(argv)
    try:
        _check(args)
        return run(args)
    except ValueError as exc:
        print(f"synthetic_validation: {exc}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(1)
    if args.as_model is None:
        args.as_model = "llada2.0-mini"
    dev, held = load_trace(args.dev), load_trace(args.held_out)
    if (dev.num_layers, dev.num_experts) != (held.num_layers, held.num_experts):
        raise ValueError(f"--dev is {dev.num_layers}x{dev.num_experts}, --held-out {held.num_layers}x"
                         f"{held.num_experts}: fit and validate on traces of one model")
    params = SynthParams.load(args.params) if args.params else sf.fit(dev, source=f"fitted on {Path(args.dev).name}")
    if args.save_params:
        params.save(args.save_params)
    syn_dev = generate(params, sf.trace_shape(dev), seed=args.seed + 1)
    syn_held = generate(params, sf.trace_shape(held), seed=args.seed + 2)
    planner = planner_seconds(args)
    cost = cost_model_from_args(held, args)
    print(f"# Synthetic workload vs recorded: fit on {args.dev}, validated on {args.held_out}")
    print(f"{held.num_layers} MoE layers x {held.num_experts} experts, top-{held.header['top_k']}, block "
          f"{held.header['block_length']}, batch {held.header.get('batch_size', 1)}; simulated time: "
          f"{args.as_model}-sized experts ({cost.expert_bytes / 2**20:.2f} MiB) on H200 + PCIe 5.0 x16, planner "
          f"{'measured during replay' if planner is None else f'{args.planner_us:g} us per access'}, "
          f"{args.warmup_sequences} warm-up sequence(s) untimed\n")
    print("## Statistics: dev trace vs a synthetic trace of its shape (fitted parameters)")
    print(sf.format_compare(sf.compare(dev, syn_dev)))
    print("\n## Statistics: held-out trace vs the synthetic held-out trace")
    print(sf.format_compare(sf.compare(held, syn_held)))
    print("\n## Simulated TPOT / fused residency, every report system (recorded vs synthetic held-out)", flush=True)
    real_runs, real_knobs = world(dev, held, cost_model_from_args(dev, args), cost, planner, args.warmup_sequences)
    if args.tune_on == "recorded":
        n = len(set(syn_held.arrays["fwd_seq"].tolist()))
        syn_runs = rp.run_systems(syn_held, "held", rp.SYSTEMS, rp.HEADLINE_PCT, cost_model_from_args(syn_held, args),
                                  planner, bounds=False, warmup_sequences=min(args.warmup_sequences, n - 1),
                                  tuned=real_knobs, profile=None)
        syn_knobs = real_knobs
    else:
        syn_runs, syn_knobs = world(syn_dev, syn_held, cost_model_from_args(syn_dev, args),
                                    cost_model_from_args(syn_held, args), planner, args.warmup_sequences)
    names = [s.name for s in rp.SYSTEMS]
    rows, orders = validation_rows(real_runs, syn_runs, names)
    print(format_validation(rows, orders))
    print("\nknobs chosen on dev (recorded / synthetic): " + "; ".join(
        f"{n}: {real_knobs.get(n) or 'defaults'} / {syn_knobs.get(n) or 'defaults'}" for n in names
        if rp.SYSTEMS[names.index(n)].grid != [{}]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
