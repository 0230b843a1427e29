"""Belady's MIN for set-valued expert requests: the offline ceiling on hit rate.

Each forward, each MoE layer requests a *set* of experts (hits count once per unique expert, as the
planner counts them). Two per-layer variants at fixed per-layer capacity ``c``:

* ``bypass=False`` (demand paging): after access t the cache must hold the requested set S_t (the
  ``c`` of S_t used soonest if ``|S_t| > c``: forced misses); the rest of the capacity keeps the
  previously cached experts whose next use is soonest. Bounds runs with CPU compute off.
* ``bypass=True`` (MIN with bypass): after access t the cache is any ``c`` experts of
  ``cache_t | S_t``, chosen by soonest next use; admission is optional. Bounds every policy of
  the planner, with or without CPU compute, because the planner's residency after an access is
  always a subset of (resident before | requested) of at most ``c`` experts.

Per-layer MIN at a uniform split does *not* bound layer-adaptive runs (they move slots between
layers). :func:`belady_global` is MIN with bypass over the interleaved sequence (layer 0..L-1 of
forward 0, then forward 1, ...) with one budget for all ``(layer, expert)`` items: it bounds any
per-layer split, fixed or changing, at the same total.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..offload.trace import Trace

INF = np.iinfo(np.int64).max // 4


@dataclass
class BeladyResult:
    name: str
    hits: int
    misses: int
    loads: int  # experts brought into the cache (misses that were admitted)
    capacity: int | list[int]  # per-layer capacities, or the total budget (global)
    per_layer_hits: list[int] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        return self.hits / (self.hits + self.misses) if self.hits + self.misses else 0.0


def request_sets(trace: Trace) -> np.ndarray:
    """Bool [num_layers, num_forwards, num_experts]: expert requested by layer in forward."""
    ids = trace.arrays["topk_ids"].astype(np.int64)  # [L, R, k]
    rows = np.diff(trace.row_offsets)
    fwd_of_row = np.repeat(np.arange(trace.num_forwards), rows)
    sets = np.zeros((trace.num_layers, trace.num_forwards, trace.num_experts), dtype=bool)
    layer_idx = np.arange(trace.num_layers)[:, None, None]
    sets[layer_idx, fwd_of_row[None, :, None], ids] = True
    return sets


def next_uses(sets: np.ndarray) -> np.ndarray:
    """Int64 like ``sets``: for each (layer, t, e) the first t' > t requesting e, else INF."""
    n = sets.shape[1]
    t = np.arange(n, dtype=np.int64)[None, :, None]
    when = np.where(sets, t, INF)
    soonest = np.minimum.accumulate(when[:, ::-1], axis=1)[:, ::-1]  # first use at >= t
    out = np.full_like(soonest, INF)
    out[:, :-1] = soonest[:, 1:]
    return out


def _keep_soonest(items: np.ndarray, next_use: np.ndarray, c: int) -> np.ndarray:
    if items.size <= c:
        return items
    return items[np.argpartition(next_use[items], c - 1)[:c]]


def belady_min(trace: Trace, capacities: int | list[int], *, bypass: bool = True) -> BeladyResult:
    """Per-layer MIN at fixed per-layer capacities (an int means the same for every layer)."""
    sets = request_sets(trace)
    nxt = next_uses(sets)
    L, F, E = sets.shape
    caps = [int(capacities)] * L if np.isscalar(capacities) else [int(c) for c in capacities]
    if len(caps) != L or min(caps) < 1:
        raise ValueError(f"capacities {caps} must give each of {L} layers at least one slot")
    hits = misses = loads = 0
    per_layer = []
    for l in range(L):
        c, cache, layer_hits = caps[l], np.zeros(E, dtype=bool), 0
        for t in range(F):
            req = sets[l, t]
            n_req = int(req.sum())
            h = int((cache & req).sum())
            layer_hits += h
            misses += n_req - h
            nu = nxt[l, t]
            if bypass:
                keep = _keep_soonest(np.flatnonzero(cache | req), nu, c)
            else:
                ri = np.flatnonzero(req)
                if ri.size >= c:
                    keep = _keep_soonest(ri, nu, c)
                else:
                    rest = _keep_soonest(np.flatnonzero(cache & ~req), nu, c - ri.size)
                    keep = np.concatenate((ri, rest))
            new = np.zeros(E, dtype=bool)
            new[keep] = True
            loads += int((new & req & ~cache).sum()) if bypass else n_req - h
            cache = new
        per_layer.append(layer_hits)
        hits += layer_hits
    name = "MIN+bypass" if bypass else "MIN"
    return BeladyResult(name, hits, misses, loads, caps, per_layer)


def belady_global(trace: Trace, total_slots: int) -> BeladyResult:
    """MIN with bypass over all layers at one budget of ``total_slots`` (bounds adaptive splits)."""
    return global_min(request_sets(trace), total_slots)


def global_min(sets: np.ndarray, total_slots: int, hit_out: np.ndarray | None = None) -> BeladyResult:
    """:func:`belady_global` over request sets ``[L, F, E]``; ``hit_out`` (same shape) gets MIN's hits."""
    nxt = next_uses(sets)
    L, F, E = sets.shape
    if total_slots < 1:
        raise ValueError(f"total_slots={total_slots} must be >= 1")
    # global time of forward t, layer l = t * L + l; an item's next use is tracked per item
    first = np.where(sets.any(axis=1), sets.argmax(axis=1) * L + np.arange(L)[:, None], INF)
    item_next = first.reshape(-1).astype(np.int64)
    cache = np.zeros(L * E, dtype=bool)
    hits = misses = loads = 0
    per_layer = [0] * L
    for t in range(F):
        for l in range(L):
            req = sets[l, t]
            sl = slice(l * E, (l + 1) * E)
            n_req = int(req.sum())
            hit = cache[sl] & req
            if hit_out is not None:
                hit_out[l, t] = hit
            h = int(hit.sum())
            per_layer[l] += h
            hits += h
            misses += n_req - h
            nu = nxt[l, t]
            item_next[sl] = np.where(nu < INF, nu * L + l, INF)
            cand = cache.copy()
            cand[sl] |= req
            before = cache[sl].copy()
            items = np.flatnonzero(cand)
            cache = np.zeros(L * E, dtype=bool)
            cache[_keep_soonest(items, item_next, total_slots)] = True
            loads += int((cache[sl] & req & ~before).sum())
    return BeladyResult("global MIN+bypass", hits, misses, loads, int(total_slots), per_layer)
