"""Learned long-horizon retention (``learned``): predict which experts come back soon, evict the rest.

Why. Belady's MIN evicts the expert used furthest in the future; on LLaDA2-shaped workloads it is
1.2-1.3x faster than confidence-guided retention at 40% of expert bytes, while a perfect
one-iteration lookahead is worth at most 1.11x, and no fixed rule (recency, frequency, confidence)
is best on every workload. CPU caches approach MIN by learning from the past what the future
turned out to be (Hawkeye/OPTgen, Mockingjay, LRB, perceptron reuse predictors): every decision
is labelled, a few accesses later, by whether the expert was used again, and a predictor learns
which features foretold it. Here the predictor is an online logistic model over a handful of
bucketed features, so it weighs recency, per-expert frequency and the decoder's confidence per
workload instead of fixing their mix.

The algorithm, per MoE layer (time ``t`` counts that layer's accesses, one per forward):

* Features of expert ``e`` after access ``t`` (observed up to ``t`` only): its age (accesses since
  its last use, bucketed), its identity x age (a per-expert recency curve: popularity), its uses in
  the last 8 accesses, OLED's confidence score (``policies/oled.py``: route stability x gate
  weight, decayed; bucketed on a log scale), and the block phase the decoder's last event reports
  x age (no block / first iteration / masked share > 1/2, > 1/4, > 0 / refresh). Each feature
  indexes one weight; the prediction is ``z_e = sum of its weights`` (a logit).
* Label: 1 if ``e`` is used in any of the next ``horizon`` accesses. The features of the last
  ``horizon`` accesses wait in a ring; when an access ages out of it, its label is known and one
  logistic-gradient step (``rate``) trains every weight it read. Nothing is tuned per workload:
  the weights start at zero (every expert equal; recency breaks ties) and follow what the workload
  shows.
* Priority: ``z`` (evict the lowest: the expert least likely to be back within the horizon), ties
  by recency. Predicted reuse (the dispatcher's amortisation and the reuse copies of ``cpu+reuse``):
  ``p / (1 - p)`` of ``p = sigmoid(z)``, capped: the geometric run of uses of a ``p``-likely expert.

Only what has been observed is read (no trace future), so the same object runs live and in replay;
the update of one access is one compiled call (``_access``), the ranking another (``_rank``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..kernels import MAX_REUSE, jit
from .base import CachePolicy, as_numpy, register
from .oled import OledPolicy

PHASES = 6  # no block, first iteration, masked share > 1/2, > 1/4, > 0, none masked (refresh)
AGES = np.array([0, 1, 2, 3, 4, 6, 9, 17, 33], dtype=np.int64)  # age bucket edges; one more bucket: never used
N_AGE = AGES.shape[0] + 1
N_SHORT = 9  # uses in the last 8 accesses: 0..8
N_SCORE = 10  # OLED's score: 0, then log2 buckets
N_FEAT = 6  # weights read per expert: age, id x age, short, score, phase x age, bias


def _offsets(num_experts: int) -> np.ndarray:
    sizes = [N_AGE, num_experts * N_AGE, N_SHORT, N_SCORE, PHASES * N_AGE, 1]
    return np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)


@jit
def _features(t, phase, last, bits, score, offs, out):
    """The weight indices each expert reads now (``out[e, :N_FEAT]``)."""
    n_age = AGES.shape[0] + 1
    for e in range(last.shape[0]):
        if last[e] < 0:
            a = n_age - 1
        else:
            age = t - last[e]
            a = 0
            while a + 1 < AGES.shape[0] and AGES[a + 1] <= age:
                a += 1
        b = bits[e] & np.uint64(0xFF)
        short = 0
        while b:
            b &= b - np.uint64(1)
            short += 1
        s = score[e]
        if s <= 0.0:
            sc = 0
        else:
            sc = int(math.floor(math.log2(s))) + 6
            sc = 1 if sc < 1 else 9 if sc > 9 else sc
        out[e, 0] = offs[0] + a
        out[e, 1] = offs[1] + e * n_age + a
        out[e, 2] = offs[2] + short
        out[e, 3] = offs[3] + sc
        out[e, 4] = offs[4] + phase * n_age + a
        out[e, 5] = offs[5]


@jit
def _access(counts, t, phase, last, bits, score, offs, w, ring, ring_used, ring_n, horizon, rate):
    """One access of a layer: mark the pending labels, train on the access that aged out, update the
    use history and store this access's features in the ring."""
    E = counts.shape[0]
    for j in range(ring_n):  # accesses still waiting for their label: used now counts for them
        for e in range(E):
            if counts[e] > 0:
                ring_used[j, e] = True
    slot = t % horizon
    if ring_n == horizon:  # the oldest entry's label is complete: one logistic step on each weight it read
        for e in range(E):
            z = 0.0
            for f in range(N_FEAT):
                z += w[ring[slot, e, f]]
            p = 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))
            g = rate * ((1.0 if ring_used[slot, e] else 0.0) - p)
            for f in range(N_FEAT):
                w[ring[slot, e, f]] += g
    for e in range(E):
        used = counts[e] > 0
        bits[e] = (bits[e] << np.uint64(1)) | np.uint64(1 if used else 0)
        if used:
            last[e] = t
    _features(t, phase, last, bits, score, offs, ring[slot])
    for e in range(E):
        ring_used[slot, e] = False


@jit
def _rank(t, last, feats, w, prio, reuse, max_reuse):
    """Priority (the logit, ties by recency) and the predicted reuse ``p / (1 - p)`` per expert."""
    for e in range(last.shape[0]):
        z = 0.0
        for f in range(N_FEAT):
            z += w[feats[e, f]]
        age = t - last[e] if last[e] >= 0 else t + 1
        prio[e] = z - 1e-9 * age
        if z > 30.0:
            r = max_reuse
        else:
            r = math.exp(z)  # p / (1 - p) of p = sigmoid(z)
        reuse[e] = r if r < max_reuse else max_reuse


@register
class LearnedPolicy(CachePolicy):
    """Retention by a reuse predictor learned online from what the past turned out to be (module docstring)."""

    name = "learned"
    tracks_usage = False
    uses_weights = True  # OLED's score, one of the features, reads the gate weights

    def __init__(self, num_layers: int, num_experts: int, horizon: int = 4, rate: float = 0.05,
                 **knobs: Any) -> None:
        super().__init__(num_layers, num_experts, **knobs)
        if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or not 1 <= horizon <= 64:
            raise ValueError(f"learned horizon={horizon!r} is invalid: must be an integer in [1, 64] (accesses)")
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 < float(rate) <= 1.0:
            raise ValueError(f"learned rate={rate!r} is invalid: must be a number in (0, 1] (learning rate)")
        self.horizon, self.rate = int(horizon), float(rate)
        L, E, H = self.num_layers, self.num_experts, self.horizon
        self._oled = OledPolicy(L, E)  # the confidence feature
        self._offs = _offsets(E)
        self._w = np.zeros((L, int(self._offs[-1])))
        self._t = np.zeros(L, dtype=np.int64)
        self._n = np.zeros(L, dtype=np.int64)  # filled ring entries
        self._last = np.full((L, E), -1, dtype=np.int64)
        self._bits = np.zeros((L, E), dtype=np.uint64)
        self._ring = np.zeros((L, H, E, N_FEAT), dtype=np.int64)
        self._ring_used = np.zeros((L, H, E), dtype=bool)
        self._prio = np.zeros((L, E))
        self._reuse = np.zeros((L, E))
        self._fresh = np.zeros(L, dtype=bool)
        self._phase = 0

    # ------------------------------------------------------------------ events
    def on_block_start(self, block_index: int, token_ids: Any) -> None:
        self._oled.on_block_start(block_index, token_ids)
        self._phase = 1

    def on_iteration(self, event: Any) -> None:
        self._oled.on_iteration(event)
        masked = as_numpy(event.masked).reshape(-1)
        share = float(np.count_nonzero(masked)) / max(masked.shape[0], 1)
        self._phase = 5 if share == 0 else 4 if share <= 0.25 else 3 if share <= 0.5 else 2

    def on_block_end(self, block_index: int, token_ids: Any) -> None:
        self._oled.on_block_end(block_index, token_ids)
        self._phase = 0

    # ------------------------------------------------------------------ routing
    def _update(self, layer: int, ids: np.ndarray, weights: Any, counts: np.ndarray, clock: int) -> None:
        self._oled._update(layer, ids, weights, counts, clock)
        t = int(self._t[layer])
        n = int(self._n[layer])
        _access(np.ascontiguousarray(counts, dtype=np.int64), t, self._phase, self._last[layer], self._bits[layer],
                self._oled.priority_array(layer), self._offs, self._w[layer], self._ring[layer],
                self._ring_used[layer], n, self.horizon, self.rate)
        self._n[layer] = min(n + 1, self.horizon)
        self._t[layer] = t + 1
        self._fresh[layer] = False

    def _compute(self, layer: int) -> None:
        if not self._fresh[layer]:
            t = int(self._t[layer]) - 1
            _rank(t, self._last[layer], self._ring[layer, t % self.horizon] if t >= 0 else self._ring[layer, 0],
                  self._w[layer], self._prio[layer], self._reuse[layer], MAX_REUSE)
            self._fresh[layer] = True

    # ------------------------------------------------------------------ ranking
    def priority_array(self, layer: int) -> np.ndarray:
        self._compute(layer)
        return self._prio[layer]

    def reuse_array(self, layer: int) -> np.ndarray:
        self._compute(layer)
        return self._reuse[layer]
