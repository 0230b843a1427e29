"""Is the synthetic workload a stand-in for a recorded one? Fit on dev, compare every system on held-out.

    .venv/bin/python eval/synthetic_validation.py --dev traces/dev/long-b16-bs1.trace \\
        --held-out traces/held-out/long-b16-bs1.trace [--as-model llada2.0-mini] [--planner-us 2]
    .venv/bin/python eval/synthetic_validation.py --planner-us 2 \\
        --pair traces/dev/deep-b16-bs1.trace traces/held-out/deep-b16-bs1.trace \\
        --pair traces.long/dev/long-b16-bs1.trace traces.long/held-out/long-b16-bs1.trace \\
        [--systems oled lru-full hybrimoe ...] [--untuned]

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

4. The ranking criterion (issue 38.3), per model and size, and one table over every ``--pair`` at the end: the
   fastest system recorded vs synthetic, Kendall tau over all systems replayed (>= 0.9), the TPOT error of the
   three fastest recorded systems (each within +-10%), pass/fail, and the distinct experts per block (union over
   a block's steps, layer mean) synthetic / recorded on the held-out traces.

``--systems`` replays a subset of the report's systems and ``--untuned`` takes each at its first grid setting
instead of tuning it on dev (both only to keep a run short on a busy machine: the table says which were used).
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

from oled_hf.offload.trace import Trace, load_trace  # noqa: E402
from oled_hf.sim import report as rp  # noqa: E402
from oled_hf.sim import synth_fit as sf  # noqa: E402
from oled_hf.sim.hardware import add_cost_model_args, cost_model_from_args, planner_seconds  # noqa: E402
from oled_hf.sim.synthetic import SynthParams, generate  # noqa: E402

TOLERANCE = 0.10


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-b of two score lists (1 = same order)."""
    from scipy.stats import kendalltau

    return float(kendalltau(a, b).statistic)


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


TAU_MIN = 0.9  # issue 38.3: Kendall tau over all systems at least this
TOP_N = 3  # issue 38.3: the three fastest recorded systems within TOLERANCE of their recorded TPOT


def block_distinct(trace: Trace) -> float:
    """Distinct experts per block (union over a block's denoising steps), mean over layers."""
    from oled_hf.sim.routing_stats import routing_stats

    vals = [x for x in routing_stats(trace).summary()["activation_ratio_per_block"] if x is not None]
    return float(np.mean(vals)) * trace.num_experts if vals else float("nan")


def criterion(rows, orders, pcts=rp.HEADLINE_PCT, tol=TOLERANCE, tau_min=TAU_MIN, top_n=TOP_N):
    """Per size: (fastest recorded, fastest synthetic, tau, [(system, error)] of the ``top_n`` fastest recorded,
    pass): pass = same fastest, tau >= ``tau_min`` and each of the ``top_n`` within ``tol``."""
    out = {}
    for j, p in enumerate(pcts):
        tau, _, fr, fs, rank_r, _ = orders[p]
        top = [(n, rows[n][j][2]) for n in rank_r[:top_n]]
        ok = fr == fs and tau >= tau_min and all(abs(e) <= tol for _, e in top)
        out[p] = (fr, fs, tau, top, ok)
    return out


def format_criterion(results, tol=TOLERANCE, tau_min=TAU_MIN, top_n=TOP_N) -> str:
    """One row per (model, size) of ``results`` = [(label, criterion(...), distinct ratio)]."""
    head = ["model", "size", "fastest recorded / synthetic", "Kendall tau", f"{top_n} fastest: TPOT error",
            "pass", "distinct/block syn/rec"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    passed = total = 0
    for label, crit, ratio in results:
        for p, (fr, fs, tau, top, ok) in crit.items():
            passed, total = passed + ok, total + 1
            why = [] if ok else (["fastest" if fr != fs else ""] + ([f"tau<{tau_min:g}"] if tau < tau_min else [])
                                 + ([f">+-{tol:.0%}"] if any(abs(e) > tol for _, e in top) else []))
            lines.append(f"| {label} | {p:g}% | {fr} / {fs} | {tau:.3f} | "
                         + ", ".join(f"{n} {e:+.1%}" for n, e in top)
                         + f" | {'PASS' if ok else 'FAIL (' + ', '.join(w for w in why if w) + ')'} | {ratio:.3f} |")
    lines.append(f"\n{passed}/{total} model-size cells pass (same fastest, tau >= {tau_min:g}, the {top_n} fastest "
                 f"within +-{tol:.0%})")
    return "\n".join(lines)


def _check(args: argparse.Namespace) -> None:
    for flag, path in [("--pair", x) for pair in args.pair for x in pair] + [("--params", x) for x in args.params]:
        if not Path(path).is_file():
            raise ValueError(f"{flag} {path}: no such file")
    for flag, vals in (("--params", args.params), ("--save-params", args.save_params)):
        if vals and len(vals) != len(args.pair):
            raise ValueError(f"{flag}: {len(vals)} given for {len(args.pair)} trace pairs; allowed: one per pair "
                             "(in --pair order)")
    for path in args.save_params:
        if Path(path).exists() and not args.overwrite:
            raise ValueError(f"--save-params {path}: exists; pass --overwrite to replace it")
    known = [s.name for s in rp.SYSTEMS]
    bad = [n for n in args.systems or [] if n not in known]
    if bad:
        raise ValueError(f"--systems {' '.join(bad)}: unknown; allowed: {', '.join(known)}")
    if args.systems is not None and len(args.systems) < 2:
        raise ValueError(f"--systems {' '.join(args.systems)}: a ranking needs at least 2 systems")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dev", default=None, help="recorded dev trace: the fit and the recorded world's tuning")
    p.add_argument("--held-out", default=None, help="recorded held-out trace of the same model")
    p.add_argument("--pair", nargs=2, action="append", default=[], metavar=("DEV", "HELD_OUT"),
                   help="a (dev, held-out) pair of one model's recorded traces; repeat for several models")
    p.add_argument("--params", action="append", default=[],
                   help="fitted parameters (JSON) instead of fitting on the dev trace; one per pair")
    p.add_argument("--save-params", action="append", default=[], help="write the fitted parameters (JSON) here; "
                   "one per pair")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --save-params file")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic traces")
    p.add_argument("--systems", nargs="+", default=None, help="replay only these report systems (default: all)")
    p.add_argument("--untuned", action="store_true", help="each system at its first grid setting (no dev tuning)")
    p.add_argument("--tune-on", choices=["synthetic", "recorded"], default="synthetic",
                   help="where the synthetic world's knobs and kTransformers' profile come from (default: its own "
                        "synthetic dev trace, as for a model without recorded traces)")
    p.add_argument("--warmup-sequences", type=int, default=1, help="untimed warm-up sequences (as the report)")
    add_cost_model_args(p)
    args = p.parse_args(argv)
    try:
        if (args.dev is None) != (args.held_out is None):
            raise ValueError("--dev and --held-out: give both (or use --pair DEV HELD_OUT)")
        if args.dev is not None:
            args.pair.insert(0, [args.dev, args.held_out])
        if not args.pair:
            raise ValueError("no traces: give --dev and --held-out, or --pair DEV HELD_OUT (repeatable)")
        _check(args)
        return run(args)
    except ValueError as exc:
        print(f"synthetic_validation: {exc}", file=sys.stderr)
        return 2


def world(dev: Trace, held: Trace, cost_dev, cost_held, planner, warmup: int, systems=rp.SYSTEMS,
          untuned: bool = False):
    """Tune every system on ``dev`` (``untuned``: its first grid setting), replay on ``held`` at the headline
    sizes: (runs, chosen knobs)."""
    n_dev = len(set(dev.arrays["fwd_seq"].tolist()))
    n_held = len(set(held.arrays["fwd_seq"].tolist()))
    profile = rp.dev_profile(dev)
    if untuned:
        tuned = {s.name: s.grid[0] for s in systems}
    else:
        tuned = {name: knobs for name, (knobs, _) in rp.tune(dev, systems, cost_dev, planner, min(warmup, n_dev - 1),
                                                             profile=profile).items()}
    runs = rp.run_systems(held, "held", systems, rp.HEADLINE_PCT, cost_held, planner, bounds=False,
                          warmup_sequences=min(warmup, n_held - 1), tuned=tuned, profile=profile)
    return runs, tuned


def run(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(1)
    if args.as_model is None:
        args.as_model = "llada2.0-mini"
    systems = tuple(s for s in rp.SYSTEMS if args.systems is None or s.name in args.systems)
    results = []
    for i, (dev_path, held_path) in enumerate(args.pair):
        label, crit, ratio = run_pair(args, i, dev_path, held_path, systems)
        results.append((label, crit, ratio))
    print(f"\n# Ranking criterion (issue 38.3): {len(systems)} systems "
          f"({'all report systems' if args.systems is None else ', '.join(s.name for s in systems)}), "
          f"{'untuned (first grid setting)' if args.untuned else 'tuned on each world dev trace'}")
    print(format_criterion(results))
    return 0


def run_pair(args: argparse.Namespace, i: int, dev_path: str, held_path: str, systems):
    """Fit, compare and replay one model's pair; prints its tables, returns (label, criterion, distinct ratio)."""
    dev, held = load_trace(dev_path), load_trace(held_path)
    if (dev.num_layers, dev.num_experts) != (held.num_layers, held.num_experts):
        raise ValueError(f"--pair {dev_path} {held_path}: {dev.num_layers}x{dev.num_experts} vs "
                         f"{held.num_layers}x{held.num_experts}; fit and validate on traces of one model")
    params = (SynthParams.load(args.params[i]) if args.params
              else sf.fit(dev, source=f"fitted on {Path(dev_path).name}"))
    if args.save_params:
        params.save(args.save_params[i])
    syn_dev = generate(params, sf.trace_shape(dev), seed=args.seed + 1)
    syn_held = generate(params, sf.trace_shape(held), seed=args.seed + 2)
    planner = planner_seconds(args)
    cost = cost_model_from_args(held, args)
    print(f"# Synthetic workload vs recorded: fit on {dev_path}, validated on {held_path}")
    print(f"{held.num_layers} MoE layers x {held.num_experts} experts, top-{held.header['top_k']}, block "
          f"{held.header['block_length']}, batch {held.header.get('batch_size', 1)}; simulated time: "
          f"{args.as_model}-sized experts ({cost.expert_bytes / 2**20:.2f} MiB) on H200 + PCIe 5.0 x16, planner "
          f"{'measured during replay' if planner is None else f'{args.planner_us:g} us per access'}, "
          f"{args.warmup_sequences} warm-up sequence(s) untimed\n")
    print("## Statistics: dev trace vs a synthetic trace of its shape (fitted parameters)")
    print(sf.format_compare(sf.compare(dev, syn_dev)))
    print("\n## Statistics: held-out trace vs the synthetic held-out trace")
    print(sf.format_compare(sf.compare(held, syn_held)))
    print(f"\n## Simulated TPOT / fused residency, {len(systems)} systems (recorded vs synthetic held-out)", flush=True)
    real_runs, real_knobs = world(dev, held, cost_model_from_args(dev, args), cost, planner, args.warmup_sequences,
                                  systems, args.untuned)
    if args.tune_on == "recorded":
        n = len(set(syn_held.arrays["fwd_seq"].tolist()))
        syn_runs = rp.run_systems(syn_held, "held", systems, rp.HEADLINE_PCT, cost_model_from_args(syn_held, args),
                                  planner, bounds=False, warmup_sequences=min(args.warmup_sequences, n - 1),
                                  tuned=real_knobs, profile=None)
        syn_knobs = real_knobs
    else:
        syn_runs, syn_knobs = world(syn_dev, syn_held, cost_model_from_args(syn_dev, args),
                                    cost_model_from_args(syn_held, args), planner, args.warmup_sequences,
                                    systems, args.untuned)
    names = [s.name for s in systems]
    rows, orders = validation_rows(real_runs, syn_runs, names)
    print(format_validation(rows, orders))
    print("\nknobs chosen on dev (recorded / synthetic): " + "; ".join(
        f"{s.name}: {real_knobs.get(s.name) or 'defaults'} / {syn_knobs.get(s.name) or 'defaults'}" for s in systems
        if s.grid != [{}]))
    ratio = block_distinct(syn_held) / block_distinct(held)
    print(f"distinct experts per block (held-out, layer mean): recorded {block_distinct(held):.2f}, synthetic "
          f"{block_distinct(syn_held):.2f} (ratio {ratio:.3f})\n", flush=True)
    return Path(dev_path).stem, criterion(rows, orders), ratio


if __name__ == "__main__":
    raise SystemExit(main())
