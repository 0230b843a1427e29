"""Seeds of one synthetic workload, and the workloads "like" a published model, in the report.

A synthetic workload's figures are one draw of its generator: one seed can favour one system by
luck. Traces labelled ``NAME-s<seed>`` (``mini-like-s1`` ... ``mini-like-s5``: ``trace synth --seed``)
form a seed group; the report gives each system's x fused (and x bound) as median [min-max] over the
group's seeds (``seed_table``), and the headline margin, oled against the strongest fair system per
seed, as median and range (``seed_margin_lines``). ``eval/mini_like_seeds.py`` prints the same tables.

A trace of ``trace synth --like NAME`` names its model ``synthetic (like NAME)`` in its header
(``like_model``): the report times it at NAME's expert size and prints every assumed figure of
``synth_like.like(NAME)`` with its source, and the stated figures, target vs achieved per seed
(``figure_table``). Pure data and formatting.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable
from typing import Any

SEED_LABEL = re.compile(r"^(?P<base>.+)-s(?P<seed>\d+)$")
LIKE_MODEL = re.compile(r"^synthetic \(like (?P<name>[^)]+)\)$")


def like_model(model: str) -> str | None:
    """The published model a ``trace synth --like`` trace is like (its header's ``model``), else None."""
    m = LIKE_MODEL.match(str(model))
    return m["name"] if m else None


def seed_groups(labels: Iterable[str]) -> dict[str, list[tuple[int, str]]]:
    """``{base: [(seed, label), ...]}`` for labels ``base-s<seed>`` with at least 2 distinct seeds, by seed."""
    by: dict[str, dict[int, str]] = {}
    for label in labels:
        m = SEED_LABEL.match(label)
        if m:
            by.setdefault(m["base"], {})[int(m["seed"])] = label
    return {base: sorted(seeds.items()) for base, seeds in by.items() if len(seeds) >= 2}


def spread(values: list[float], fmt: str = ".4g") -> str:
    """median [min-max] of ``values``."""
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"


def _pick(runs: list, system: str, pct: float) -> Any:
    return next((r for r in runs if r.system == system and r.pct == pct), None)


def _strongest(runs: list, pct: float, ours: str) -> Any:
    at = [r for r in runs if r.pct == pct and r.system != ours]
    return min(at, key=lambda r: r.result.tpot_s) if at else None


def seed_table(runs_per_seed: dict[int, list], systems: Iterable[str], pcts: Iterable[float],
               lp_note: str = "") -> str:
    """Markdown: per system, x fused and x bound (LP) at each size as median [min-max] over the seeds.

    ``runs_per_seed``: ``{seed: [report.Run, ...]}``. x bound is over the seeds with an LP bound
    (``lp_note`` says which, in its header); the last rows are the LP bound's own x fused."""
    pcts = list(pcts)
    runs = list(runs_per_seed.values())
    with_lp = any(x.bound_ratio for r in runs for x in r)  # no LP at all: no x bound columns
    head = (["system"] + [f"{p:g}%: x fused" for p in pcts]
            + [f"{p:g}%: x bound (LP{', ' + lp_note if lp_note else ''})" for p in pcts if with_lp])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in systems:
        fused = [[g.result.ratio_to_full for g in (_pick(r, name, p) for r in runs) if g] for p in pcts]
        if not any(fused):
            continue
        bound = [[g.x_bound for g in (_pick(r, name, p) for r in runs) if g and g.bound_ratio] for p in pcts]
        lines.append("| " + " | ".join([name] + [spread(v, ".2f") if v else "-" for v in fused]
                                       + [spread(v, ".2f") if v else "-" for v in bound if with_lp]) + " |")
    lp = [[next((x.bound_ratio for x in r if x.pct == p and x.bound_ratio), None) for r in runs] for p in pcts]
    lp = [[b for b in v if b] for v in lp]
    if any(lp):
        lines.append("| " + " | ".join(["LP bound (valid)"] + [spread(v, ".2f") if v else "-" for v in lp]
                                       + ["1.00" if v else "-" for v in lp]) + " |")
    return "\n".join(lines)


def seed_margin_lines(runs_per_seed: dict[int, list], pcts: Iterable[float], ours: str = "oled") -> list[str]:
    """Per size: oled's x fused and the strongest fair system / oled, median [min-max] over the seeds."""
    lines = []
    for pct in pcts:
        mine, ratios, strongest = [], [], {}
        for runs in runs_per_seed.values():
            m, b = _pick(runs, ours, pct), _strongest(runs, pct, ours)
            if m is None or b is None:
                continue
            mine.append(m.result.ratio_to_full)
            ratios.append(b.result.tpot_s / m.result.tpot_s)
            strongest[b.system] = strongest.get(b.system, 0) + 1
        if not ratios:
            continue
        wins = sum(r >= 1 for r in ratios)
        lines.append(f"- {pct:g}%: {ours} {spread(mine, '.2f')}x fused; strongest fair / {ours} = "
                     f"{spread(ratios, '.3f')} (> 1: {ours} faster); strongest fair per seed: "
                     + ", ".join(f"{k} {v}x" for k, v in sorted(strongest.items()))
                     + f"; {ours} lowest TPOT on {wins} of {len(ratios)} seeds")
    return lines


def fastest_counts(runs_per_seed: dict[int, list], systems: Iterable[str], pct: float) -> dict[str, int]:
    """How many seeds each system is fastest on at one size."""
    names = list(systems)
    wins: dict[str, int] = {}
    for runs in runs_per_seed.values():
        got = [x for x in (_pick(runs, n, pct) for n in names) if x]
        if got:
            best = min(got, key=lambda x: x.result.ratio_to_full)
            wins[best.system] = wins.get(best.system, 0) + 1
    return wins


def figure_table(name: str, rows_per_seed: dict[int, list[tuple[str, float, float]]],
                 tolerance: float) -> tuple[str, bool]:
    """Markdown: each stated figure's target and its achieved value per seed, median [range]; all within?"""
    seeds = sorted(rows_per_seed)
    first = rows_per_seed[seeds[0]]
    head = ("| figure | target | " + " | ".join(f"seed {s}" for s in seeds)
            + f" | median [range] | all within +-{tolerance:.0%} |")
    lines = [f"### {name}: stated figures, target vs achieved", "", head, "|" + "---|" * (len(seeds) + 4)]
    ok_all = True
    for j, (fig, target, _) in enumerate(first):
        got = [rows_per_seed[s][j][2] for s in seeds]
        ok = all(abs(g - target) <= tolerance * abs(target) for g in got)
        ok_all &= ok
        cells = " | ".join(f"{g:.4g} ({(g - target) / target:+.1%})" for g in got)
        lines.append(f"| {fig} | {target:.4g} | {cells} | {spread(got)} | {'yes' if ok else 'NO'} |")
    return "\n".join(lines), ok_all
