"""Offline schedules, timed on replay's timeline: the upper side of the bracket around the optimum.

A schedule says, per layer access, which missed experts are copied to the GPU (the others run on
the CPU) and which resident experts are evicted to make room; the cache holds at most
``total_slots`` experts over all layers (any split, as ``lp_bound`` assumes). It is timed by
:class:`~oled_hf.sim.timeline.Timeline` exactly as ``replay`` times a plan with no prefetch and
the planner time it is given per access (``planner_s``, default none; the report charges every system's):
the non-expert part, demand copies issued at the plan on the one copy engine, the
GPU experts in the order their weights are ready, the CPU batch concurrently (at the shared DRAM
rate while the copy engine runs). So every schedule here is one the timeline's rules can run, and
its time is an upper bound on the optimum of the model the LP relaxes.

* :func:`greedy_schedule`: retention by Belady's next use (evict the resident expert used farthest
  in the future), and per access the number ``k`` of misses to copy (largest CPU time first; a miss
  is copied only if it is admitted: a free slot, or a victim used later than it) that ends the
  access earliest on the timeline. Myopic in ``k``; an upper reference, not the optimum.
  ``reuse_credit`` (beta >= 0) makes it less myopic: ``k`` minimises the access's end minus beta
  times the CPU time each copied expert saves at its next use (known offline), so a copy that pays
  for itself later is taken although it delays this access.
* :func:`best_greedy`: the least time of :func:`greedy_schedule` over a few credits, each a
  schedule the timeline runs (the upper side of the bracket).
* :func:`exhaustive_optimum`: every schedule of this kind on a tiny trace (tests hand-check the
  bracket ``LP <= optimum <= greedy`` with it).
"""

from __future__ import annotations

import copy as _copy
import itertools
from dataclasses import dataclass

import numpy as np

from oled_hf.offload.costmodel import CostModel

from ..belady import INF
from ..timeline import Timeline


@dataclass
class Access:
    """One layer access: its layer and the tokens routed to each expert of that layer."""

    layer: int
    counts: np.ndarray  # [E]


def accesses_of(counts: np.ndarray, forwards: np.ndarray) -> list[Access]:
    """The accesses of ``counts[:, forwards, :]`` (``[L, F, E]`` tokens) in trace order."""
    return [Access(l, counts[l, f]) for f in forwards for l in range(counts.shape[0])]


def charge_access(tl: Timeline, acc: Access, hits: list[int], copied: list[int], cpu: list[int],
                  cm: CostModel, ready: dict[tuple[int, int], float],
                  prefetch: list[tuple[int, int]] | None = None, planner_s: float = 0.0) -> float:
    """Time one access on ``tl`` (replay's charging, ``planner_s`` of host planning per access); returns its end.

    ``prefetch``: (layer, expert) items queued behind the demand copies at the same plan, as replay
    issues prefetches at the plan, before the layer's experts run (so a CPU batch sharing host DRAM
    sees the engine busy with them too); their landing times go to ``ready``.
    """
    start, plan_ready = tl.begin_layer(cm.nonexpert_s_per_layer, planner_s)
    if copied:
        for e, land in zip(copied, tl.copies(len(copied), plan_ready)):
            ready[(acc.layer, e)] = float(land)
    if prefetch:
        for it, land in zip(prefetch, tl.copies(len(prefetch), plan_ready, low=True, keys=list(prefetch))):
            ready[it] = float(land)
    gpu = hits + copied
    r = np.array([ready.get((acc.layer, e), 0.0) for e in gpu])
    g = cm.gpu_times(acc.counts[gpu]) if gpu else np.zeros(0)
    c = acc.counts[cpu]
    cpu_s = cm.cpu_batch_time(c) if cpu else 0.0
    shared = cm.host_dram_bytes_per_s > 0 and cm.cpu_shared_fixed_s > cm.cpu_expert_fixed_s
    cpu_sh = cm.cpu_batch_time(c, shared=True) if cpu and shared else None
    return tl.end_layer(start, plan_ready, cm.gpu_layer_fixed_s, r, g, cpu_s, cpu_sh).end


class Resident:
    """The offline cache: each resident (layer, expert) item and the index of its next use, as one array.

    Finding a victim (the resident item used farthest in the future, ties to the larger (layer, expert),
    outside the protected ones) is one vectorised max instead of a Python scan of up to every slot per miss,
    which made the schedules take tens of minutes on one trace.
    """

    def __init__(self, num_layers: int, num_experts: int) -> None:
        self.num_experts = num_experts
        self.next_use = np.full(num_layers * num_experts, -1, dtype=np.int64)  # -1: not resident
        self.size = 0

    def copy(self) -> Resident:
        other = Resident.__new__(Resident)
        other.num_experts, other.next_use, other.size = self.num_experts, self.next_use.copy(), self.size
        return other

    def _at(self, item: tuple[int, int]) -> int:
        return item[0] * self.num_experts + item[1]

    def __contains__(self, item: tuple[int, int]) -> bool:
        return bool(self.next_use[self._at(item)] >= 0)

    def __len__(self) -> int:
        return self.size

    def set(self, item: tuple[int, int], use: int) -> None:
        i = self._at(item)
        self.size += self.next_use[i] < 0
        self.next_use[i] = use

    def drop(self, item: tuple[int, int]) -> None:
        i = self._at(item)
        self.size -= self.next_use[i] >= 0
        self.next_use[i] = -1

    def victim(self, protected: set[tuple[int, int]]) -> tuple[int, tuple[int, int]] | None:
        """``max((next use, item))`` over the resident items not in ``protected``; None if there is none."""
        idx = [self._at(it) for it in protected]
        saved = self.next_use[idx]
        self.next_use[idx] = -1
        top = int(self.next_use.max())
        i = int(np.flatnonzero(self.next_use == top)[-1]) if top >= 0 else -1
        self.next_use[idx] = saved
        return None if i < 0 else (top, (i // self.num_experts, i % self.num_experts))


def shape_of(accs: list[Access]) -> tuple[int, int]:
    """(layers, experts) of a list of accesses."""
    return max(a.layer for a in accs) + 1, accs[0].counts.shape[0]


def _hit_ready(ready: dict[tuple[int, int], float], layer: int, hits: list[int]) -> dict[tuple[int, int], float]:
    """What a trial :func:`charge_access` of one access reads of ``ready`` (its hits' landing times), as a new
    dict the trial may write: copying the whole ``ready`` per trial made the schedules quadratic."""
    return {(layer, e): ready[(layer, e)] for e in hits if (layer, e) in ready}


def _next_uses(accs: list[Access]) -> list[dict[int, int]]:
    """Per access, for each requested expert, the index of the next access requesting it (INF if none)."""
    out: list[dict[int, int]] = [{} for _ in accs]
    last: dict[tuple[int, int], int] = {}
    for t in range(len(accs) - 1, -1, -1):
        a = accs[t]
        for e in np.flatnonzero(a.counts).tolist():
            out[t][e] = last.get((a.layer, e), INF)
            last[(a.layer, e)] = t
    return out


def greedy_schedule(accs: list[Access], cm: CostModel, total_slots: int, timed_from: int = 0,
                    reuse_credit: float = 0.0, planner_s: float = 0.0) -> float:
    """Seconds of the timed accesses (``timed_from`` on) under :func:`greedy_schedule`'s rules (module doc)."""
    if not (np.isfinite(reuse_credit) and reuse_credit >= 0):
        raise ValueError(f"reuse_credit={reuse_credit!r} must be a finite number >= 0")
    nxt = _next_uses(accs)
    cache = Resident(*shape_of(accs))  # item -> index of its next use
    tl, ready = Timeline(cm.copy_time()), {}
    t0 = 0.0
    for t, acc in enumerate(accs):
        if t == timed_from:
            t0 = max(tl.gpu_free, tl.host_free)
        req = np.flatnonzero(acc.counts).tolist()
        hits = [e for e in req if (acc.layer, e) in cache]
        misses = sorted((e for e in req if (acc.layer, e) not in cache),
                        key=lambda e: -float(cm.cpu_times(acc.counts[[e]])[0]))
        for e in hits:
            cache.set((acc.layer, e), nxt[t][e])
        protected = {(acc.layer, e) for e in hits}
        admits: list[tuple[int, tuple[int, int] | None]] = []  # (miss, victim) in copy order
        trial = cache.copy()
        for e in misses:
            if nxt[t][e] >= INF:
                continue
            victim = None
            if len(trial) >= total_slots:
                found = trial.victim(protected)
                if found is None:
                    continue
                u, victim = found
                if u <= nxt[t][e]:
                    continue
                trial.drop(victim)
            trial.set((acc.layer, e), nxt[t][e])
            protected.add((acc.layer, e))
            admits.append((e, victim))
        credit = np.cumsum([0.0] + [reuse_credit * float(cm.cpu_times(accs[nxt[t][e]].counts[[e]])[0])
                                    for e, _ in admits])
        best_k, best_end = 0, np.inf
        for k in range(len(admits) + 1):
            copied = [e for e, _ in admits[:k]]
            end = charge_access(tl.clone(), acc, hits, copied, [e for e in misses if e not in copied], cm,
                                _hit_ready(ready, acc.layer, hits), planner_s=planner_s) - credit[k]
            if end < best_end - 1e-15:
                best_k, best_end = k, end
        copied = [e for e, _ in admits[:best_k]]
        for e, victim in admits[:best_k]:
            if victim is not None:
                cache.drop(victim)
            cache.set((acc.layer, e), nxt[t][e])
        if len(cache) > total_slots:  # cannot happen: each admit had a slot or a victim
            raise AssertionError("greedy schedule over its slot budget")
        charge_access(tl, acc, hits, copied, [e for e in misses if e not in copied], cm, ready, planner_s=planner_s)
    return max(tl.gpu_free, tl.host_free) - t0


CREDITS = (0.0, 0.25, 0.5, 1.0)  # reuse credits best_greedy tries


def best_greedy(accs: list[Access], cm: CostModel, total_slots: int, timed_from: int = 0,
                credits: tuple[float, ...] = CREDITS, planner_s: float = 0.0) -> tuple[float, float]:
    """``(seconds, credit)`` of the fastest :func:`greedy_schedule` over ``credits``."""
    if not credits:
        raise ValueError("credits must name at least one reuse credit")
    return min((greedy_schedule(accs, cm, total_slots, timed_from, c, planner_s), c) for c in credits)


def exhaustive_optimum(accs: list[Access], cm: CostModel, total_slots: int) -> float:
    """The least time over every schedule of this module's kind (tiny traces only: exponential)."""
    items = sorted({(a.layer, e) for a in accs for e in np.flatnonzero(a.counts).tolist()})
    if len(items) > 6 or len(accs) > 7:
        raise ValueError(f"exhaustive search is for tiny traces: {len(items)} experts, {len(accs)} accesses")
    best = [np.inf]

    def go(t: int, cache: frozenset, tl: Timeline, ready: dict) -> None:
        if t == len(accs):
            best[0] = min(best[0], max(tl.gpu_free, tl.host_free))
            return
        acc = accs[t]
        req = np.flatnonzero(acc.counts).tolist()
        hits = [e for e in req if (acc.layer, e) in cache]
        misses = [e for e in req if (acc.layer, e) not in cache]
        for k in range(len(misses) + 1):
            for copied in itertools.combinations(misses, k):
                keep_hits = {(acc.layer, e) for e in hits}
                others = [it for it in cache if it not in keep_hits]
                room = total_slots - len(keep_hits)
                if k > room:
                    continue
                # which of the other residents stay (the rest are evicted)
                for n_stay in range(min(len(others), room - k), -1, -1):
                    for stay in itertools.combinations(others, n_stay):
                        new_cache = frozenset(keep_hits | set(stay) | {(acc.layer, e) for e in copied})
                        tl2, ready2 = _copy.deepcopy(tl), dict(ready)
                        charge_access(tl2, acc, hits, list(copied), [e for e in misses if e not in copied], cm, ready2)
                        go(t + 1, new_cache, tl2, ready2)
                # evicting a hit after use is never needed here: hits keep their slots

    for n0 in range(min(total_slots, len(items)), -1, -1):  # any initial cache is free
        for init in itertools.combinations(items, n0):
            go(0, frozenset(init), Timeline(cm.copy_time()), {})
    return best[0]
