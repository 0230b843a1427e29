"""Layer-adaptive allocation: split a fixed slot budget across MoE layers by measured benefit.

Layers differ: some route to a few popular experts with short reuse distances, others spread over
many experts and gain little from extra slots (vLLM PR #37190: "pure LRU lets early layers
monopolise the cache"; AdapMoE sizes layers by DP). We measure, per layer, the *hit curve*: how
many hits an LRU cache of c slots would have had on the observed request stream, for every c at
once, from LRU stack distances (Mattson et al.): an expert requested again after d other distinct
experts were requested in between is a hit for every capacity > d. The marginal gain of the c-th
slot of layer l is the number of requests at distance c-1. Slots then go where the marginal gain
is highest. The curve is policy-independent (it describes the request stream), cheap to keep
(one sort of 256 floats per access) and responds to phase changes through exponential decay.
"""

from __future__ import annotations

import numpy as np


def uniform_capacities(total: int, num_layers: int, num_experts: int) -> list[int]:
    """``total`` slots split as evenly as possible; earlier layers take the remainder."""
    if not num_layers <= total <= num_layers * num_experts:
        raise ValueError(
            f"total={total} slots cannot be split over {num_layers} layers of {num_experts} experts "
            f"(need {num_layers} <= total <= {num_layers * num_experts})"
        )
    base, extra = divmod(int(total), int(num_layers))
    return [base + (1 if l < extra else 0) for l in range(num_layers)]


def _antitonic(gains: np.ndarray) -> np.ndarray:
    """Non-increasing least-squares fit of one layer's marginal gains (pool adjacent violators).

    These are the slopes of the least concave majorant of the hit curve, so the greedy below takes
    a prefix of each layer's slots and is optimal for the concave-hull problem.
    """
    values: list[float] = []
    weights: list[int] = []
    for g in gains.tolist():
        values.append(g)
        weights.append(1)
        while len(values) > 1 and values[-2] < values[-1]:
            w = weights[-2] + weights[-1]
            v = (values[-2] * weights[-2] + values[-1] * weights[-1]) / w
            values[-2:] = [v]
            weights[-2:] = [w]
    return np.repeat(values, weights)


def allocate_capacities(
    total_slots: int,
    num_layers: int,
    num_experts: int,
    demand: np.ndarray | list[float],
    min_slots: int = 1,
    uniform_bias: float = 0.0,
) -> list[int]:
    """Split ``total_slots`` over layers: every layer in ``[min_slots, num_experts]``, sum = total.

    ``demand`` is either 1-D ``[num_layers]`` (relative weights, e.g. mean unique experts per
    access: proportional split, largest remainders) or 2-D ``[num_layers, num_experts]`` (marginal
    hits of each layer's c-th slot, e.g. an LRU stack-distance histogram: slots go to the highest
    concave-hull marginal gains). Ties are broken towards the most even split, then by layer index,
    so the result is deterministic. ``uniform_bias`` (2-D only) charges each slot of deviation from
    the even split that fraction of the mean marginal gain near the even share, so measurement
    noise on nearly flat curves does not move slots.
    """
    uniform_capacities(total_slots, num_layers, num_experts)  # validates the total
    if not 1 <= min_slots <= num_experts or min_slots * num_layers > total_slots:
        raise ValueError(f"min_slots={min_slots} is infeasible for {total_slots} slots over {num_layers} layers")
    d = np.asarray(demand, dtype=np.float64)
    spare = total_slots - min_slots * num_layers
    per_layer = num_experts - min_slots
    if d.ndim == 1:
        if d.shape[0] != num_layers:
            raise ValueError(f"demand has {d.shape[0]} layers, expected {num_layers}")
        w = np.maximum(d, 0.0)
        w = np.full(num_layers, 1.0) if w.sum() <= 0 else w
        # proportional split with caps: water-fill a concave gain with equal steps per layer
        gains = w[:, None] / (np.arange(per_layer)[None, :] + 1.0)
    elif d.ndim == 2 and d.shape == (num_layers, num_experts):
        gains = np.stack([_antitonic(np.maximum(d[l, min_slots:], 0.0)) for l in range(num_layers)])
        if uniform_bias > 0 and per_layer > 0:
            share = total_slots / num_layers - min_slots  # even share, in extra slots
            at_share = gains[:, min(max(int(share), 0), per_layer - 1)]
            scale = uniform_bias * float(at_share.mean() if at_share.mean() > 0 else gains.mean())
            gains = gains - scale * (np.arange(per_layer)[None, :] + 0.5 - share)
    else:
        raise ValueError(f"demand must have shape [{num_layers}] or [{num_layers}, {num_experts}], got {d.shape}")
    if spare == 0 or per_layer == 0:
        return [min_slots] * num_layers
    cols = np.broadcast_to(np.arange(per_layer)[None, :], gains.shape)
    rows = np.broadcast_to(np.arange(num_layers)[:, None], gains.shape)
    order = np.lexsort((rows.ravel(), cols.ravel(), -gains.ravel()))[:spare]
    extra = np.bincount(rows.ravel()[order], minlength=num_layers)
    return [int(min_slots + e) for e in extra]


class AdaptiveAllocator:
    """Accumulates per-layer hit curves from accesses and proposes capacities at block boundaries.

    Damping: a proposal moves each layer only ``damping`` of the way to the target, waits for
    ``warmup_accesses`` accesses per layer, and is skipped when it would move fewer than
    ``min_move_fraction`` of the slots, so the split does not thrash on noise.
    """

    def __init__(
        self,
        num_layers: int,
        num_experts: int,
        total_slots: int,
        *,
        min_slots: int = 1,
        damping: float = 0.5,
        history_decay: float = 0.8,
        warmup_accesses: int = 16,
        min_move_fraction: float = 0.01,
        uniform_bias: float = 0.05,
    ) -> None:
        uniform_capacities(total_slots, num_layers, num_experts)
        self.num_layers, self.num_experts, self.total_slots = num_layers, num_experts, total_slots
        self.min_slots, self.damping, self.history_decay = min_slots, damping, history_decay
        self.warmup_accesses, self.min_move_fraction = warmup_accesses, min_move_fraction
        self.uniform_bias = uniform_bias
        self.hist = np.zeros((num_layers, num_experts + 1))  # [:, E] = first-time requests
        self._last = np.full((num_layers, num_experts), -1.0)  # access index of last request
        self._accesses = np.zeros(num_layers, dtype=np.int64)
        self._id_frac = np.arange(num_experts) / (num_experts + 1.0)

    def observe(self, layer: int, counts: np.ndarray) -> None:
        """One access of ``layer``; ``counts`` = tokens per expert (only > 0 matters)."""
        req = np.flatnonzero(counts)
        last = self._last[layer]
        prev = last[req]
        # distance = distinct experts used more recently than e's previous use (E = first use)
        dist = self.num_experts - np.searchsorted(np.sort(last), prev, side="right")
        dist[prev < 0] = self.num_experts
        self.hist[layer] += np.bincount(dist, minlength=self.num_experts + 1)
        # recency key: the access index plus a fraction < 1 that orders the access's experts as
        # LRU breaks ties (token count, then id), so a set of n spreads over distances 0..n-1
        c = counts[req]
        last[req] = (c + self._id_frac[req]) * (0.5 / (float(c.max()) + 1.0)) + float(self._accesses[layer])
        self._accesses[layer] += 1

    def target(self) -> list[int]:
        """Capacities maximising the (concave-hull) hits of the observed streams."""
        return allocate_capacities(
            self.total_slots, self.num_layers, self.num_experts, self.hist[:, : self.num_experts],
            self.min_slots, self.uniform_bias,
        )

    def propose(self, current: list[int]) -> list[int] | None:
        """New capacities for a block boundary, or None to keep ``current``."""
        if self._accesses.min() < self.warmup_accesses:
            return None
        target = np.asarray(self.target(), dtype=np.float64)
        cur = np.asarray(current, dtype=np.float64)
        step = cur + self.damping * (target - cur)
        new = np.floor(step).astype(np.int64)
        remainder = self.total_slots - int(new.sum())
        if remainder > 0:  # largest fractional parts first, then layer index
            frac = step - new
            new[np.lexsort((np.arange(self.num_layers), -frac))[:remainder]] += 1
        new = np.clip(new, self.min_slots, self.num_experts)
        diff = self.total_slots - int(new.sum())
        while diff != 0:  # clipping changed the sum: fix towards the target, deterministically
            gap = (target - new) * np.sign(diff)
            ok = (new < self.num_experts) if diff > 0 else (new > self.min_slots)
            l = int(np.argmax(np.where(ok, gap, -np.inf)))
            new[l] += int(np.sign(diff))
            diff -= int(np.sign(diff))
        self.hist *= self.history_decay
        moved = int(np.abs(new - cur).sum()) // 2
        if moved < max(1, self.min_move_fraction * self.total_slots):
            return None
        return [int(x) for x in new]
