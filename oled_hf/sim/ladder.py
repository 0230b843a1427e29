"""The report's oracle ladder, section (i): where the headroom of retention lies.

Per trace and cache size, one retention part after another under the same dispatch and allocation:

* ``belady`` (knows the whole future) and ``next-oracle`` (knows exactly the next access's expert
  set of each layer, nothing further), both from ``offload/policies/oracle.py``;
* ``foresight-K`` (K = 16, 4, 2): Belady within the next K accesses of each layer, LRU beyond: how far
  ahead the value of retention lies;
* ``belady-reuse``: ``belady`` whose reuse prediction, which the dispatcher's admission reads (rule 4's
  reuse copies), is the exact run of uses a copy would be held for: the Belady rung with cost-aware
  admission (fair dispatch only: pure caching copies every miss, so it would equal ``belady``);
  ``lru-reuse`` the same exact reuse on LRU's retention (what perfect admission adds to an online
  retention; fair dispatch only);
* ``previous-set`` (the previous access's set first, then recency), ``phase`` (LRU with block-start
  memory, ``offload/policies/phase.py``: the one signal of a block boundary alone), ``lru``, ``lfu``;
* ``score`` (HybriMoE's gate-score EMA), ``oled`` and ``learned`` (a next-use predictor learned online,
  ``offload/policies/learned.py``), each at its own defaults.

Two dispatches: the *strongest fair* one (the parts and tuned knobs of the report's strongest
composed baseline, ``lru-full``: CPU compensation with reuse copies, layer-adaptive split; only the
retention part is swapped) and *pure caching* (every miss copied, uniform split), where hit rate
alone decides. Read it as: ``next-oracle`` far below ``belady`` means the gain is in longer-horizon
value, not in predicting the next iteration; ``belady-reuse`` below ``belady`` is what knowing each
copy's reuse is worth to admission; ``oled`` close to ``lru`` and far below ``next-oracle`` means the
predictor, not the cache, is what is missing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..offload.system import System
from ..offload.trace import Trace
from .belady import request_sets
from .replay import replay
from .report import HEADLINE_PCT, Run, md_table, slots_for

FORESIGHT = (16, 4, 2)  # the foresight-K rungs: Belady within K accesses of each layer, LRU beyond
RUNGS = ("belady-reuse", "belady", *(f"foresight-{k}" for k in FORESIGHT), "next-oracle", "lru-reuse", "previous-set",
         "phase", "lru", "lfu", "score", "oled", "learned")
ORACLES = ("belady", "belady-reuse", "next-oracle", "lru-reuse", "foresight")
# differ from belady and lru only in what the dispatcher admits: fair dispatch only
ADMISSION_ONLY = ("belady-reuse", "lru-reuse")
ONLINE = ("score", "oled", "learned")  # the rungs a live system can run beyond lru, lfu and phase
FAIR_BASE = "lru-full"  # the composed baseline whose dispatch and allocation every rung gets


def rung_system(base: System, rung: str, future: list[np.ndarray] | None) -> System:
    """``base`` with its retention part (and that part's knobs) replaced by the rung's (``foresight-K``: the
    ``foresight`` retention with horizon K)."""
    knobs = {k: v for k, v in base.knobs.items() if not k.startswith("retention.")}
    retention, _, k = rung.partition("-") if rung.startswith("foresight-") else (rung, "", "")
    system = dataclasses.replace(base, retention=retention, knobs=knobs)
    if k:
        system = system.with_knobs(retention__horizon=int(k))
    return system.with_knobs(retention__future=future) if retention in ORACLES else system


def pure_caching(base: System) -> System:
    return System(base.retention, "none", "copy", "uniform", {})


def oracle_ladder(trace: Trace, label: str, fair: System, cost: Any, planner_s: float | None,
                  warmup_sequences: int = 0, pcts: tuple[float, ...] = HEADLINE_PCT) -> dict[str, list[Run]]:
    """``{"fair": runs, "pure caching": runs}``, one run per rung and size (``Run.system`` = the rung)."""
    future = list(request_sets(trace))
    out: dict[str, list[Run]] = {"fair": [], "pure caching": []}
    for dispatch, base in (("fair", fair), ("pure caching", pure_caching(fair))):
        for pct in pcts:
            size = slots_for(pct, trace.num_experts)
            for rung in RUNGS:
                if dispatch == "pure caching" and rung in ADMISSION_ONLY:
                    continue
                r = replay(trace, rung, size, system=rung_system(base, rung, future), cost_model=cost,
                           planner_s=planner_s, warmup_sequences=warmup_sequences)
                out[dispatch].append(Run(label, rung, pct, r))
    return out


def ladder_table(runs: list[Run], pcts: tuple[float, ...] = HEADLINE_PCT) -> str:
    """Hit rate and x fused per rung and size, with each rung's TPOT gain over lru (x)."""
    by = {(r.system, r.pct): r.result for r in runs}
    head = ["retention"] + [f"{p:g}%: hit / x fused / gain over lru" for p in pcts]
    rows = []
    for rung in RUNGS:
        if not any((rung, p) in by for p in pcts):
            continue  # a rung this dispatch does not run
        cells = [rung]
        for p in pcts:
            r, lru = by.get((rung, p)), by.get(("lru", p))
            cells.append("-" if r is None else
                         f"{r.hit_rate:.3f} / {r.ratio_to_full:.2f} / {lru.tpot_s / r.tpot_s:.3f}x")
        rows.append(cells)
    return md_table(head, rows)


def headroom_lines(runs: list[Run], pcts: tuple[float, ...] = HEADLINE_PCT) -> list[str]:
    """One line per size: how much of lru -> belady the next-iteration oracle and oled cover, what exact reuse
    adds to belady, and the best online rung."""
    by = {(r.system, r.pct): r.result for r in runs}
    lines = []
    for p in pcts:
        lru, nxt, best, ours = (by.get((n, p)) for n in ("lru", "next-oracle", "belady", "oled"))
        if None in (lru, nxt, best, ours):
            continue
        gap = lru.tpot_s - best.tpot_s
        nxt_share, our_share = (f"{(lru.tpot_s - r.tpot_s) / gap:.0%}" if gap > 0 else "n/a" for r in (nxt, ours))
        line = (f"- {p:g}%: lru -> belady is {lru.tpot_s / best.tpot_s:.3f}x; the next-iteration oracle "
                f"covers {nxt_share} of it ({lru.tpot_s / nxt.tpot_s:.3f}x), oled {our_share} "
                f"({lru.tpot_s / ours.tpot_s:.3f}x)")
        adds = [f"{base.tpot_s / by[(oracle, p)].tpot_s:.3f}x to {oracle.split('-')[0]}"
                for oracle, base in (("belady-reuse", best), ("lru-reuse", lru)) if (oracle, p) in by]
        if adds:
            line += "; exact reuse for admission adds " + ", ".join(adds)
        seen = [(k, by[(f"foresight-{k}", p)]) for k in sorted(FORESIGHT) if (f"foresight-{k}", p) in by]
        if seen and gap > 0:
            line += "; foresight of " + ", ".join(f"{k} accesses covers {(lru.tpot_s - r.tpot_s) / gap:.0%}"
                                                  for k, r in seen)
        online = [(by[(n, p)].tpot_s, n) for n in ONLINE if (n, p) in by]
        if online:
            t, name = min(online)
            line += f"; best online rung {name} ({lru.tpot_s / t:.3f}x)"
        lines.append(line)
    return lines
