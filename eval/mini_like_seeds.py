"""The --like workloads over seeds: each stated figure (target vs achieved) and each system's simulated TPOT as the
median and range over at least 5 seeds (issue 38, deliverables 1 and 4).

    .venv/bin/python eval/mini_like_seeds.py --like llada2.0-mini llada2.0-flash --seeds 1 2 3 4 5        # figures
    .venv/bin/python eval/mini_like_seeds.py --like llada2.0-mini --seeds 1 2 3 4 5 --replay --planner-us 20

Per model and seed: ``synth_like.like(NAME)`` with its decoder calibrated for that seed and shape
(``calibrate_decoder``), a trace of ``--sequences`` sequences x ``--blocks`` blocks (default 25 x 4: one warm-up
sequence, then 24 timed, as ``trace synth --like``); every stated figure with its target, its achieved value per
seed, and the median and range. Every assumed figure is printed once with its source. ``--replay``: every
``report.SYSTEMS`` system replays each seed's trace at 15/25/40% (first grid setting, kTransformers' profile from
a dev trace of seed + 100; no tuning, so no held-out data is tuned on), timed as the model on H200 + PCIe 5.0
(simulated); prints x fused as median [min-max] over seeds and how often each system is fastest. Replays are CPU
heavy: about 1-2 min per seed and model on an idle core (19 layers), more for flash (31).

``--tune-seeds S ...`` (with ``--replay``): every system instead searches its report grid (``report.tune``, at most
4 settings) on traces of the same workload drawn with those seeds (the workload's own dev split: keep them out of
``--seeds``), scored by the mean over the dev seeds of mean x fused at 15/25/40%, and replays the held-out seeds
with its chosen setting; the chosen setting and every searched score are printed. The report tunes every system
on the deep toy's dev trace instead; this asks whether the ranking survives tuning on the workload itself.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a clone without installing
    sys.path.insert(0, str(ROOT))

from oled_hf.sim.report_seeds import fastest_counts, figure_table, seed_table  # noqa: E402
from oled_hf.sim.synth_like import TOLERANCE, calibrate_decoder, figures, like, like_names  # noqa: E402
from oled_hf.sim.synthetic import TraceShape, generate  # noqa: E402


def workload(name: str, seed: int, sequences: int, blocks: int):
    """(params calibrated for this seed, shape, trace)."""
    params = like(name)
    shape = TraceShape.uniform(sequences, blocks, params.block_length, prompt_length=params.block_length)
    calibrate_decoder(params, shape, seed)
    return params, shape, generate(params, shape, seed=seed)


def replay_table(name: str, runs_per_seed: dict[int, list], pcts, names: list[str]) -> str:
    """x fused as median [min-max] over seeds (the report's ``report_seeds.seed_table``) and the fastest per seed."""
    lines = [f"### {name}: simulated x fused, median [min-max] over seeds {', '.join(map(str, runs_per_seed))}", "",
             seed_table(runs_per_seed, names, pcts)]
    for p in pcts:
        wins = fastest_counts(runs_per_seed, names, p)
        lines.append(f"\n{p:g}%: fastest per seed: " + ", ".join(f"{k} {v}x" for k, v in sorted(wins.items())))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--like", nargs="+", default=["llada2.0-mini", "llada2.0-flash"], help="workloads (default both)")
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5], help="seeds (at least 5; default 1-5)")
    p.add_argument("--sequences", type=int, default=25, help="sequences per trace (default 25: 1 warm-up + 24)")
    p.add_argument("--blocks", type=int, default=4, help="blocks per sequence (default 4)")
    p.add_argument("--replay", action="store_true", help="also replay every report system (CPU heavy)")
    p.add_argument("--systems", nargs="+", default=None, help="report systems to replay (default: all of them)")
    p.add_argument("--planner-us", type=float, default=20.0, help="planner us per access (default 20, as the report)")
    p.add_argument("--tune-seeds", nargs="+", type=int, default=[],
                   help="with --replay: tune every system on traces of these seeds first (disjoint from --seeds)")
    args = p.parse_args(argv)
    from oled_hf.sim import report as rp

    known = [s.name for s in rp.SYSTEMS]
    wrong = [n for n in (args.systems or []) if n not in known]
    if wrong:
        print(f"mini_like_seeds: --systems {wrong[0]}: unknown; allowed: {', '.join(known)}", file=sys.stderr)
        return 2
    bad = [n for n in args.like if n not in like_names()]
    if bad:
        print(f"mini_like_seeds: --like {bad[0]}: unknown; allowed: {', '.join(like_names())}", file=sys.stderr)
        return 2
    if len(set(args.seeds)) < 5 or min(args.seeds) < 0:
        print(f"mini_like_seeds: --seeds {' '.join(map(str, args.seeds))}: need at least 5 distinct non-negative "
              "seeds", file=sys.stderr)
        return 2
    if set(args.tune_seeds) & set(args.seeds) or (args.tune_seeds and not args.replay) or min(args.tune_seeds,
                                                                                                  default=0) < 0:
        print(f"mini_like_seeds: --tune-seeds {' '.join(map(str, args.tune_seeds))}: need --replay, non-negative "
              "seeds and none of --seeds (tuning on held-out seeds is not allowed)", file=sys.stderr)
        return 2
    if args.sequences < 2 or args.blocks < 1:
        print("mini_like_seeds: --sequences must be at least 2 (one warm-up) and --blocks at least 1", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(1)
    ok_all = True
    for name in args.like:
        rows, runs, assumptions = {}, {}, None
        args.tuned = tune_on_seeds(name, args) if args.tune_seeds else {}
        for seed in args.seeds:
            params, shape, trace = workload(name, seed, args.sequences, args.blocks)
            rows[seed] = figures(params, trace)
            assumptions = assumptions or params.assumptions[:-1]  # the last one is the per-seed calibration
            print(f"[{name} seed {seed}] " + "; ".join(f"{f} {a:.4g}" for f, _, a in rows[seed]) +
                  f"; hazard {params.hazard:.4f}", flush=True)
            if args.replay:
                runs[seed] = replay(params, shape, trace, seed, args)
        print(f"\n## {name} ({params.num_layers} MoE layers x {params.num_experts}, top-{params.top_k}, block "
              f"{params.block_length}; {args.sequences} sequences x {args.blocks} blocks per seed)\n")
        print("figures and their sources:\n" + "\n".join(f"  - {a}" for a in assumptions) + "\n")
        table, ok = figure_table(name, rows, TOLERANCE)
        ok_all &= ok
        print(table + "\n")
        if args.replay:
            print(replay_table(name, runs, rp.HEADLINE_PCT, args.systems or known) + "\n")
    return 0 if ok_all else 1


def tune_on_seeds(name: str, args: argparse.Namespace) -> dict[str, dict]:
    """Per system, the report-grid setting of least mean x fused over the ``--tune-seeds`` traces (printed)."""
    from oled_hf.sim import report as rp
    from oled_hf.sim.hardware import cost_model_from_args

    systems = [s for s in rp.SYSTEMS if args.systems is None or s.name in args.systems]
    scores: dict[str, dict[str, list[float]]] = {}
    knobs_of: dict[str, dict[str, dict]] = {}
    for seed in args.tune_seeds:
        params, _, dev = workload(name, seed, args.sequences, args.blocks)
        cost = cost_model_from_args(dev, argparse.Namespace(as_model=params.source.removeprefix("like ")))
        found = rp.tune(dev, systems, cost, args.planner_us * 1e-6, warmup_sequences=1, profile=rp.dev_profile(dev))
        for sys_name, (_, searched) in found.items():
            for knobs, score in searched:
                key = ", ".join(f"{k}={v}" for k, v in sorted(knobs.items())) or "defaults"
                scores.setdefault(sys_name, {}).setdefault(key, []).append(score)
                knobs_of.setdefault(sys_name, {})[key] = knobs
        print(f"[{name}] tuned on dev seed {seed}", flush=True)
    chosen = {}
    print(f"\n{name}: settings chosen on dev seeds {' '.join(map(str, args.tune_seeds))} (mean x fused at "
          f"{'/'.join(f'{p:g}' for p in rp.HEADLINE_PCT)}%, mean over the dev seeds):")
    for sys_name, by_key in scores.items():
        means = {k: sum(v) / len(v) for k, v in by_key.items()}
        best = min(means, key=means.get)
        chosen[sys_name] = knobs_of[sys_name][best]
        print(f"  {sys_name}: {best}  (" + "; ".join(f"{k}: {m:.3f}" for k, m in means.items()) + ")")
    return chosen


def replay(params, shape, trace, seed: int, args: argparse.Namespace) -> list:
    from oled_hf.sim import report as rp
    from oled_hf.sim.hardware import cost_model_from_args

    dev = generate(params, shape if len(shape.sequences) <= 4 else TraceShape(shape.batch, shape.sequences[:4]),
                   seed=seed + 100)
    cost = cost_model_from_args(trace, argparse.Namespace(as_model=params.source.removeprefix("like ")))
    systems = [s for s in rp.SYSTEMS if args.systems is None or s.name in args.systems]
    return rp.run_systems(trace, f"{params.source} s{seed}", systems, rp.HEADLINE_PCT, cost,
                          args.planner_us * 1e-6, bounds=False, warmup_sequences=1, tuned=getattr(args, "tuned", {}),
                          profile=rp.dev_profile(dev))


if __name__ == "__main__":
    raise SystemExit(main())
