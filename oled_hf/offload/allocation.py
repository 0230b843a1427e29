"""Layer-adaptive allocation: split a fixed slot budget across MoE layers by measured benefit.

Layers differ: some route to a few popular experts with short reuse distances, others spread over
many experts and gain little from extra slots (vLLM PR #37190: "pure LRU lets early layers
monopolise the cache"; AdapMoE sizes layers by DP). We measure, per layer, the *hit curve*: how
many hits an LRU cache of c slots would have had on the observed request stream, for every c at
once, from LRU stack distances (Mattson et al.): an expert requested again after d other distinct
experts were requested in between is a hit for every capacity > d. The marginal gain of the c-th
slot of layer l is the number of requests at distance c-1. Slots then go where the marginal gain
is highest. The curve is policy-independent (it describes the request stream) and responds to
phase changes through exponential decay.

Cost: ``observe`` runs once per MoE layer per forward, on the live runtime's critical path, so it
only stores the access's token counts; the stack distances of the stored accesses are computed
together when the curve is read (``target``/``propose`` at a block end) and added in access
order, so the histogram is the same whenever a batch is folded in. Both rules here are written
once, as kernels (``kernels.jit``: compiled by numba, or the same source run as Python where
``kernels.COMPILED`` is false): the fold walks an LRU stack access by access (``fold_counts``, ~2 us
per access at 256 experts compiled) and the fit pools adjacent violators (``antitonic_pav``). They
call no other kernel, so they live here rather than in ``kernels.py`` (whose one-file rule is about
numba's cache missing a callee's edit).
"""

from __future__ import annotations

import numpy as np

from . import kernels


def uniform_capacities(total: int, num_layers: int, num_experts: int) -> list[int]:
    """``total`` slots split as evenly as possible; earlier layers take the remainder."""
    if not num_layers <= total <= num_layers * num_experts:
        raise ValueError(
            f"total={total} slots cannot be split over {num_layers} layers of {num_experts} experts "
            f"(need {num_layers} <= total <= {num_layers * num_experts})"
        )
    base, extra = divmod(int(total), int(num_layers))
    return [base + (1 if l < extra else 0) for l in range(num_layers)]


@kernels.jit
def antitonic_pav(gains: np.ndarray) -> np.ndarray:
    """Non-increasing least-squares fit of one layer's marginal gains (pool adjacent violators).

    These are the slopes of the least concave majorant of the hit curve, so the greedy in
    :func:`allocate_capacities` takes a prefix of each layer's slots and is optimal for the
    concave-hull problem. Blocks are pooled left to right, each pooled value being
    ``(v1*w1 + v2*w2)/(w1+w2)``, so the floats depend only on that order.
    """
    n = gains.shape[0]
    values = np.empty(n)
    weights = np.empty(n, dtype=np.int64)
    top = 0
    for i in range(n):
        v = gains[i]
        w = 1
        while top > 0 and values[top - 1] < v:
            top -= 1
            pw = weights[top]
            w_new = pw + w
            v = (values[top] * pw + v * w) / w_new
            w = w_new
        values[top] = v
        weights[top] = w
        top += 1
    return np.repeat(values[:top], weights[:top])


@kernels.jit
def fold_counts(counts: np.ndarray, recency: np.ndarray, hist: np.ndarray, id_bits: int) -> None:
    """Add ``n`` accesses' LRU stack distances to one layer's histogram, walking the stack access by access.

    ``counts`` is ``[n, E]`` (the stored accesses), ``recency`` the layer's codes before them
    (``rank * P + id`` for requested experts, rank increasing with recency, ``id - P`` if never
    requested; P = 2**id_bits >= E), replaced by the codes after them; ``hist`` gets one row added
    per access, in order, so batching does not change the sums. The stack lists experts most recent
    first, so an expert's index is its stack distance (``E``: a first request). An access moves its
    experts to the top in decreasing (count, id), LRU's tie order within one access.
    """
    n, E = counts.shape
    P = np.int64(1) << id_bits
    stack = np.argsort(recency)[::-1].copy()  # codes are distinct: most recent first
    seen = recency >= 0
    row = np.empty(E + 1)
    rest = np.empty(E, dtype=np.int64)
    for a in range(n):
        row[:] = 0.0
        first = 0
        n_req = 0
        n_rest = 0
        for d in range(E):
            e = stack[d]
            if counts[a, e] > 0:
                if seen[e]:
                    row[d] = 1.0
                else:
                    first += 1
                n_req += 1
            else:
                rest[n_rest] = e
                n_rest += 1
        row[E] = first
        for i in range(E + 1):
            if row[i]:  # x + 0.0 == x: the histogram holds no -0.0 (sums of counts, decayed by a factor)
                hist[i] = hist[i] + row[i]
        if n_req == 0:
            continue
        # the access's experts to the top in decreasing (count, id): a counting sort by count
        top_count = 0
        for e in range(E):
            if counts[a, e] > top_count:
                top_count = counts[a, e]
        start = np.zeros(top_count + 2, dtype=np.int64)  # start[c]: experts with a count above c
        for e in range(E):
            if counts[a, e] > 0:
                start[counts[a, e] - 1] += 1
                seen[e] = True
        for c in range(top_count - 1, -1, -1):
            start[c] += start[c + 1]
        for e in range(E - 1, -1, -1):
            c = counts[a, e]
            if c > 0:
                stack[start[c]] = e
                start[c] += 1
        stack[n_req:] = rest[:n_rest]
    n_seen = 0
    for e in range(E):
        if seen[e]:
            n_seen += 1
    for d in range(E):
        e = stack[d]
        recency[e] = (n_seen - 1 - d) * P + e if d < n_seen else e - P


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
        gains = np.stack([antitonic_pav(np.maximum(d[l, min_slots:], 0.0)) for l in range(num_layers)])
        if uniform_bias > 0 and per_layer > 0:
            share = total_slots / num_layers - min_slots  # even share, in extra slots
            at_share = gains[:, min(max(int(share), 0), per_layer - 1)]
            scale = uniform_bias * float(at_share.mean() if at_share.mean() > 0 else gains.mean())
            gains = gains - scale * (np.arange(per_layer)[None, :] + 0.5 - share)
    else:
        raise ValueError(f"demand must have shape [{num_layers}] or [{num_layers}, {num_experts}], got {d.shape}")
    if spare == 0 or per_layer == 0:
        return [min_slots] * num_layers
    # highest gains first, ties by slot index then layer: a stable sort over the (slot, layer)-major
    # layout breaks ties in exactly that order
    order = np.argsort(-gains.T.ravel(), kind="stable")[:spare]
    extra = np.bincount(order % num_layers, minlength=num_layers)
    return [int(min_slots + e) for e in extra]


class AdaptiveAllocator:
    """Accumulates per-layer hit curves from accesses and proposes capacities at block boundaries.

    Damping: a proposal moves each layer only ``damping`` of the way to the target, waits for
    ``warmup_accesses`` accesses per layer, and is skipped when it would move fewer than
    ``min_move_fraction`` of the slots, so the split does not thrash on noise.
    """

    max_pending = 64  # stored accesses per layer before they are folded in: more than a block's forwards

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
        self._hist = np.zeros((num_layers, num_experts + 1))  # [:, E] = first-time requests
        self._id_bits = max(int(num_experts - 1).bit_length(), 1)  # codes keep the expert id in low bits
        # recency code of each expert's last request, see fold_counts (never requested: id - P < 0)
        ids = np.arange(num_experts, dtype=np.int64)
        self._recency = np.tile(ids - (1 << self._id_bits), (num_layers, 1))
        self._accesses = [0] * num_layers  # a list: one increment per access, ~10x cheaper than NumPy's
        # token counts of the accesses not yet folded into the histogram, per layer (rows 0..n-1)
        self._pending = np.zeros((num_layers, self.max_pending, num_experts), dtype=np.int32)
        self._n_pending = [0] * num_layers

    @property
    def hist(self) -> np.ndarray:
        """Stack-distance histogram per layer, ``[num_layers, num_experts + 1]`` (all accesses folded in)."""
        self._fold_all()
        return self._hist

    @hist.setter
    def hist(self, value: np.ndarray) -> None:
        self._fold_all()
        self._hist = value

    def observe(self, layer: int, counts: np.ndarray) -> None:
        """One access of ``layer``; ``counts`` = tokens per expert (only > 0 matters). Cheap: stores a copy."""
        n = self._n_pending[layer]
        self._pending[layer, n] = counts
        self._n_pending[layer] = n + 1
        self._accesses[layer] += 1
        if n + 1 == self._pending.shape[1]:
            self._fold(layer)

    def _fold_all(self) -> None:
        for layer in range(self.num_layers):
            if self._n_pending[layer]:
                self._fold(layer)

    def _fold(self, layer: int) -> None:
        """Add the stored accesses of ``layer`` to its histogram, in order (:func:`fold_counts`).

        Per access and requested expert e, the LRU stack distance is the number of experts whose
        last request is more recent than e's (``num_experts`` on a first request). Within one
        access LRU breaks ties by token count, then id, so a set of n spreads over distances 0..n-1.
        """
        n = self._n_pending[layer]
        self._n_pending[layer] = 0
        fold_counts(self._pending[layer, :n].astype(np.int64), self._recency[layer], self._hist[layer], self._id_bits)

    def target(self) -> list[int]:
        """Capacities maximising the (concave-hull) hits of the observed streams."""
        return allocate_capacities(
            self.total_slots, self.num_layers, self.num_experts, self.hist[:, : self.num_experts],
            self.min_slots, self.uniform_bias,
        )

    def propose(self, current: list[int]) -> list[int] | None:
        """New capacities for a block boundary, or None to keep ``current``."""
        if min(self._accesses) < self.warmup_accesses:
            return None
        target = np.asarray(self.target(), dtype=np.float64)
        cur = np.asarray(current, dtype=np.float64)
        step = cur + self.damping * (target - cur)
        new = np.floor(step).astype(np.int64)
        remainder = self.total_slots - int(new.sum())
        if remainder > 0:  # largest fractional parts first, then layer index
            frac = step - new
            new[np.argsort(-frac, kind="stable")[:remainder]] += 1
        new = np.clip(new, self.min_slots, self.num_experts)
        diff = self.total_slots - int(new.sum())
        while diff != 0:  # clipping changed the sum: fix towards the target, deterministically
            gap = (target - new) * np.sign(diff)
            ok = (new < self.num_experts) if diff > 0 else (new > self.min_slots)
            l = int(np.argmax(np.where(ok, gap, -np.inf)))
            new[l] += int(np.sign(diff))
            diff -= int(np.sign(diff))
        self._hist *= self.history_decay  # target() folded every stored access in
        moved = int(np.abs(new - cur).sum()) // 2
        if moved < max(1, self.min_move_fraction * self.total_slots):
            return None
        return [int(x) for x in new]
