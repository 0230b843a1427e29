"""A tighter upper side of the bracket: the greedy offline schedule plus prefetches into idle copy time.

Why: ``greedy.greedy_schedule`` issues only demand copies, at each access's plan. At 40% of the
deep toy the copy engine then idles through every access's non-expert part and through the CPU
batch of an access that copies few experts, while the LP bound (``bounds/lp.py``) may copy an
expert during the layer accesses before its use (``cm``/``ce`` copies). This schedule keeps the
greedy's rules (Belady retention, per access the demand-copy count ``k`` that ends the access
earliest minus its reuse credit) and, after the demand copies of access ``t``, queues prefetches
for the next ``horizon`` accesses on the same engine, issued at ``t``'s plan:

* candidates: experts those accesses request that are not resident, in access order, largest CPU
  time first; each admitted as the greedy admits a miss (a free slot, or the resident expert used
  farthest in the future if that is later than the candidate's use; never one access ``t`` uses
  nor one already prefetched);
* budget: as many as the copy engine can finish by the next access's estimated plan (the end of
  ``t`` with no prefetch, plus one non-expert part), plus ``extra`` more (they may then delay the
  next access's GPU work, which its own ``k`` choice sees: a late prefetch is a hit whose weights
  arrive late).

A prefetched expert is resident from its issue (its slot is taken at ``t``'s plan) and its
landing time is the ready time the next access's GPU kernel waits for: this is how ``replay``
times a prefetch (``Timeline.copies`` FIFO, ``end_layer`` waits on ready times), so the schedule
is one the timeline runs and its time an upper bound on the optimum of the model the LP relaxes
(prefetching is outside ``greedy.exhaustive_optimum``'s schedules, so this may go below that
search; never below the LP: ``tests/sim/schedules/test_search.py``). :func:`best_search` keeps the
least over a few (credit, horizon, extra) variants; with ``horizon=0`` it is the greedy schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oled_hf.offload.costmodel import CostModel

from ..belady import INF
from ..timeline import Timeline
from .greedy import CREDITS, Access, Resident, _hit_ready, _next_uses, charge_access, shape_of

Item = tuple[int, int]


@dataclass(frozen=True)
class Variant:
    """One schedule's knobs: the greedy's reuse credit, accesses prefetched ahead, copies beyond idle time."""

    credit: float = 0.0
    horizon: int = 1
    extra: int = 0


VARIANTS = tuple(Variant(c, h, x) for c in CREDITS for h, x in ((0, 0), (1, 0), (1, 1), (1, 2), (2, 1)))
PREFETCH_VARIANTS = tuple(v for v in VARIANTS if v.horizon)  # the horizon-0 ones are offline.best_greedy's


@dataclass
class ScheduleStats:
    """Seconds of the timed accesses and what the schedule did (for the report)."""

    time_s: float
    demand_copies: int = 0
    prefetches: int = 0
    variant: Variant = Variant()


def _cpu_s(cm: CostModel, n: int) -> float:
    return float(cm.cpu_times(np.array([n]))[0])


def _admit(cache: Resident, protected: set[Item], item: Item, use: int,
           total_slots: int) -> tuple[bool, Item | None]:
    """Greedy/Belady admission of ``item`` (next used at ``use``): ``(admitted, victim)``; mutates ``cache``."""
    victim = None
    if len(cache) >= total_slots:
        found = cache.victim(protected)
        if found is None:
            return False, None
        u, victim = found
        if u <= use:
            return False, None
        cache.drop(victim)
    cache.set(item, use)
    protected.add(item)
    return True, victim


def search_schedule(accs: list[Access], cm: CostModel, total_slots: int, timed_from: int = 0,
                    variant: Variant = Variant(), planner_s: float = 0.0) -> ScheduleStats:
    """Time :func:`search_schedule`'s rules (module doc) on the timeline; the timed accesses start at ``timed_from``."""
    if not (np.isfinite(variant.credit) and variant.credit >= 0) or variant.horizon < 0 or variant.extra < 0:
        raise ValueError(f"bad variant {variant}: credit >= 0, horizon >= 0, extra >= 0")
    nxt = _next_uses(accs)
    cache = Resident(*shape_of(accs))  # item -> index of its next use
    tl, ready = Timeline(cm.copy_time()), {}
    t0, stats = 0.0, ScheduleStats(0.0, variant=variant)
    for t, acc in enumerate(accs):
        if t == timed_from:
            t0 = max(tl.gpu_free, tl.host_free)
        req = np.flatnonzero(acc.counts).tolist()
        hits = [e for e in req if (acc.layer, e) in cache]
        misses = sorted((e for e in req if (acc.layer, e) not in cache), key=lambda e: -_cpu_s(cm, acc.counts[e]))
        for e in hits:
            cache.set((acc.layer, e), nxt[t][e])
        protected = {(acc.layer, e) for e in hits}
        trial, admits = cache.copy(), []
        for e in misses:
            if nxt[t][e] < INF:
                ok, victim = _admit(trial, protected, (acc.layer, e), nxt[t][e], total_slots)
                if ok:
                    admits.append((e, victim))
        credit = np.cumsum([0.0] + [variant.credit * _cpu_s(cm, accs[nxt[t][e]].counts[e]) for e, _ in admits])
        best_k, best_end, best_raw = 0, np.inf, np.inf
        for k in range(len(admits) + 1):
            copied = [e for e, _ in admits[:k]]
            raw = charge_access(tl.clone(), acc, hits, copied, [e for e in misses if e not in copied], cm,
                                _hit_ready(ready, acc.layer, hits), planner_s=planner_s)
            if raw - credit[k] < best_end - 1e-15:
                best_k, best_end, best_raw = k, raw - credit[k], raw
        copied = [e for e, _ in admits[:best_k]]
        for e, victim in admits[:best_k]:
            if victim is not None:
                cache.drop(victim)
            cache.set((acc.layer, e), nxt[t][e])
        stats.demand_copies += len(copied)
        protected = {(acc.layer, e) for e in req}
        pre = _prefetches(accs, t, cache, protected, tl, cm, total_slots, variant, best_raw, len(copied), planner_s)
        charge_access(tl, acc, hits, copied, [e for e in misses if e not in copied], cm, ready, pre, planner_s)
        stats.prefetches += len(pre)
    stats.time_s = max(tl.gpu_free, tl.host_free) - t0
    return stats


def _prefetches(accs: list[Access], t: int, cache: Resident, protected: set[Item], tl: Timeline,
                cm: CostModel, total_slots: int, variant: Variant, end_est: float, n_demand: int,
                planner_s: float = 0.0) -> list[Item]:
    """Admit prefetches for accesses ``t+1 .. t+horizon`` into ``cache`` (mutated); the items, in copy order."""
    if variant.horizon == 0 or t + 1 >= len(accs):
        return []
    plan = max(tl.host_free, tl.gpu_free + cm.nonexpert_s_per_layer) + planner_s  # t's plan (begin_layer)
    engine = max(tl.copy_free, plan) + n_demand * tl.copy_s
    # until the next access's plan: its non-expert part and its planning
    budget = int(max(0.0, end_est + cm.nonexpert_s_per_layer + planner_s - engine) // tl.copy_s) + variant.extra
    out: list[Item] = []
    for u in range(t + 1, min(len(accs), t + 1 + variant.horizon)):
        a = accs[u]
        cand = [e for e in np.flatnonzero(a.counts).tolist() if (a.layer, e) not in cache]
        for e in sorted(cand, key=lambda e: -_cpu_s(cm, a.counts[e])):
            if len(out) >= budget:
                return out
            ok, _ = _admit(cache, protected, (a.layer, e), u, total_slots)
            if ok:
                out.append((a.layer, e))
    return out


def best_search(accs: list[Access], cm: CostModel, total_slots: int, timed_from: int = 0,
                variants: tuple[Variant, ...] = VARIANTS, planner_s: float = 0.0) -> ScheduleStats:
    """The fastest :func:`search_schedule` over ``variants`` (each a schedule the timeline runs)."""
    if not variants:
        raise ValueError("variants must name at least one schedule")
    return min((search_schedule(accs, cm, total_slots, timed_from, v, planner_s) for v in variants),
               key=lambda s: s.time_s)
