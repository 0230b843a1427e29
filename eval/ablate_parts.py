"""Which of HybriMoE's parts beats oled: every mix of the two systems' parts, replayed on a --like workload.

    .venv/bin/python eval/ablate_parts.py --like llada2.0-flash --seeds 1 2 --sequences 9 --pct 40
    .venv/bin/python eval/ablate_parts.py --like llada2.0-flash --seeds 11 12 13 14 15 --sequences 9 --pct 40

oled is ``oled+none+cpu+reuse+adaptive``, HybriMoE ``score+gate-capped+cpu+uniform`` (``system.SYSTEM_PRESETS``).
They differ in all four parts, so a loss of one to the other says nothing of which part loses. This replays the
2^4 systems that take each part from one or the other, each with the knob its part was tuned to on the workload's
dev seeds 1-2 (``eval/mini_like_seeds.py --tune-seeds 1 2``: ``--reuse-copies``, ``--decay``, ``--limit``), and
prints per system x fused as median [min-max] over the seeds, misses, copies and CPU-served expert-tokens. A
part's effect is the median ratio over the 8 pairs of systems that differ in it alone (the other three fixed),
with the range over those pairs: a part that wins in every context has a range on one side of 1.

Decide on the dev seeds (1, 2) and report the held-out ones (11-15): the seeds given are the data looked at.
Timed as the model on H200 + PCIe 5.0 (simulated), planner ``--planner-us`` per access, first sequence warm-up.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a clone without installing
    sys.path.insert(0, str(ROOT))

from mini_like_seeds import workload  # noqa: E402

from oled_hf.sim.report_seeds import spread  # noqa: E402
from oled_hf.sim.synth_like import like_names  # noqa: E402

# (part, oled's choice, HybriMoE's choice)
PARTS = (("retention", "oled", "score"), ("prefetch", "none", "gate-capped"),
         ("dispatch", "cpu+reuse", "cpu"), ("allocation", "adaptive", "uniform"))


def systems(reuse_copies: int, decay: float, limit: int):
    """``{label: System}`` for the 16 mixes; the label marks each part taken from HybriMoE with its letter."""
    from oled_hf.offload.system import System

    out = {}
    for picks in itertools.product((0, 1), repeat=len(PARTS)):
        parts = {name: choice[pick] for (name, *choice), pick in zip(PARTS, picks)}
        knobs = {"dispatch.shared_dram": True}  # the oled preset's knob (a no-op at the H200 preset's DRAM rate)
        if parts["dispatch"] == "cpu+reuse":
            knobs["dispatch.reuse_copies"] = reuse_copies
        if parts["retention"] == "score":
            knobs["retention.decay"] = decay
        if parts["prefetch"] == "gate-capped":
            knobs["prefetch.limit"] = limit
        label = "".join("RPDA"[i] if pick else "." for i, pick in enumerate(picks))
        out[label] = System(**parts, knobs=knobs)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--like", default="llada2.0-flash", help="workload (default llada2.0-flash)")
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2], help="seeds (default the dev seeds 1 2)")
    p.add_argument("--sequences", type=int, default=9, help="sequences per trace (default 9: 1 warm-up + 8)")
    p.add_argument("--blocks", type=int, default=4, help="blocks per sequence (default 4)")
    p.add_argument("--pct", nargs="+", type=float, default=[40.0], help="cache sizes in %% (default 40)")
    p.add_argument("--reuse-copies", type=int, default=2, help="oled dispatch's reuse copies (default 2, as tuned)")
    p.add_argument("--decay", type=float, default=0.5, help="HybriMoE score decay (default 0.5, as tuned)")
    p.add_argument("--limit", type=int, default=4, help="HybriMoE prefetch limit (default 4, as tuned)")
    p.add_argument("--planner-us", type=float, default=20.0, help="planner us per access (default 20)")
    args = p.parse_args(argv)
    if args.like not in like_names():
        print(f"ablate_parts: --like {args.like}: unknown; allowed: {', '.join(like_names())}", file=sys.stderr)
        return 2
    if args.sequences < 2 or args.blocks < 1 or not args.seeds or not all(0 < q <= 100 for q in args.pct):
        print("ablate_parts: need --sequences >= 2, --blocks >= 1, a seed, and --pct in (0, 100]", file=sys.stderr)
        return 2
    import torch

    from oled_hf.sim.hardware import cost_model_from_args
    from oled_hf.sim.replay import replay
    from oled_hf.sim.report import slots_for

    torch.set_num_threads(1)
    mixes = systems(args.reuse_copies, args.decay, args.limit)
    res: dict[tuple[str, float], list] = {}
    for seed in args.seeds:
        params, _, trace = workload(args.like, seed, args.sequences, args.blocks)
        cost = cost_model_from_args(trace, argparse.Namespace(as_model=params.source.removeprefix("like ")))
        for pct in args.pct:
            size = slots_for(pct, trace.num_experts)
            for label, system in mixes.items():  # round-robin is moot: simulated time is deterministic
                r = replay(trace, label, size, system=system, cost_model=cost, planner_s=args.planner_us * 1e-6,
                           warmup_sequences=1)
                res.setdefault((label, pct), []).append(r)
        print(f"[{args.like} seed {seed}] replayed {len(mixes)} systems", flush=True)
    print(f"\n## {args.like}: the 16 mixes of oled's and HybriMoE's parts, seeds {' '.join(map(str, args.seeds))} "
          f"({args.sequences} sequences x {args.blocks} blocks, first a warm-up; planner {args.planner_us:g} us)\n")
    print("label: a letter where the part is HybriMoE's (R retention score decay "
          f"{args.decay:g}, P prefetch gate-capped limit {args.limit}, D dispatch cpu without reuse copies, "
          f"A allocation uniform), '.' where it is oled's (oled, none, cpu+reuse reuse_copies={args.reuse_copies}, "
          "adaptive). '....' is oled, 'RPDA' HybriMoE.\n")
    for pct in args.pct:
        print(f"### {pct:g}%\n\n| mix | system | x fused | misses | copies | CPU expert-tokens |\n"
              "|---|---|---|---|---|---|")
        order = sorted(mixes, key=lambda k: statistics.median(r.ratio_to_full for r in res[(k, pct)]))
        for label in order:
            rs = res[(label, pct)]
            print(f"| `{label}` | {mixes[label].parts} | {spread([r.ratio_to_full for r in rs])} | "
                  f"{statistics.median(r.misses for r in rs):.0f} | {statistics.median(r.copies for r in rs):.0f} | "
                  f"{statistics.median(r.cpu_expert_tokens for r in rs):.0f} |")
        print(f"\n{pct:g}%: each part's effect, taking HybriMoE's over oled's with the other three fixed "
              "(x fused ratio, < 1: HybriMoE's part is faster; median [min-max] over the 8 contexts and the seeds)\n")
        for i, (name, ours, theirs) in enumerate(PARTS):
            ratios = []
            for label in mixes:
                if label[i] == ".":
                    other = label[:i] + "RPDA"[i] + label[i + 1:]
                    ratios += [b.ratio_to_full / a.ratio_to_full for a, b in zip(res[(label, pct)], res[(other, pct)])]
            print(f"- {name}: {theirs} over {ours}: {spread(ratios)}")
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
