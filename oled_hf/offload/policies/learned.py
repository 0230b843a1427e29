"""Learned retention (``learned``): predict which experts come back within a few accesses, evict the rest.

Why. Belady's MIN evicts the expert used furthest in the future; on LLaDA2-shaped workloads it is
1.2-1.3x faster than confidence-guided retention at 40% of expert bytes, and no fixed rule
(recency, frequency, confidence) is best on every workload. CPU caches approach MIN by learning
from the past what the future turned out to be (Hawkeye/OPTgen, Mockingjay, perceptron reuse
predictors): every decision is labelled, a few accesses later, by whether the line was used again,
and a predictor learns which features foretold it. Here the predictor is an online logistic model
over a handful of bucketed features, so it weighs recency, per-expert popularity and the decoder's
confidence per workload instead of fixing their mix.

The algorithm, per MoE layer (time ``t`` counts that layer's accesses, one per forward):

* Features of expert ``e`` after access ``t`` (observed up to ``t`` only), each indexing one weight:
  its identity x its age (accesses since its last use, bucketed: ``AGES``): a per-expert recency
  curve, i.e. popularity; its uses in the last 8 accesses; OLED's confidence score
  (``policies/oled.py``: route stability x gate weight, decayed) as halvings below the layer's top
  score (scale-free, no sort) x age; the block phase the decoder's last event reports x age (no
  block / first iteration / masked share > 1/2, > 1/4, > 0 / refresh). ``z_e`` = the sum of its
  weights, a logit. (Age, score and bias alone, as features of their own, changed nothing on the dev
  traces and cost a third more.)
* Label: 1 if ``e`` is used in any of the next ``horizon`` accesses of the layer. The features of
  the last ``horizon`` accesses wait in a ring; when an access leaves it, its labels are known (used
  since it was made: the expert's last use is later) and one AdaGrad step of the logistic loss
  (``rate`` over the root of each weight's summed squared gradients) trains every weight it read.
  Weights start at zero (every expert equal; OLED's score, then recency break ties) and follow what
  the workload shows: nothing is tuned per workload, and the per-weight step shrinks where evidence
  accumulates (a fixed step either chases noise or lags a shift: on the dev traces 0.05 was best on
  the deep toy and 0.01 on mini-like; AdaGrad's 0.3 beat both on each).
* Priority: ``z`` (evict the lowest: the expert least likely to be back within the horizon), ties by
  OLED's score, then recency. Predicted reuse (the dispatcher's amortisation and the reuse copies of
  ``cpu+reuse``): ``p / (1 - p)`` of ``p = sigmoid(z)``, capped: the geometric run of ``p``-likely uses.

Only what has been observed is read (no trace future), so the same object runs live and in replay;
plans are deterministic (float64, fixed order). On the critical path an access is OLED's own update
(for its score) and one compiled call (``_observe``: history, features, ranking); the training step is
deferred (``run_shadows``, ``_train``), as a CPU cache trains its predictor off the critical path: the
executor runs it once the layer is issued, and it always runs before the next access or event, so the
decisions do not depend on when. The ranking of access ``t`` reads the weights trained through access
``t - 1 - horizon``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..kernels import MAX_REUSE, jit
from .base import CachePolicy, as_numpy, register
from .oled import OledPolicy

PHASES = 6  # no block, first iteration, masked share > 1/2, > 1/4, > 0, none masked (refresh)
AGES = np.array([0, 1, 2, 3, 4, 6, 9, 17, 33], dtype=np.int64)  # age bucket edges; one more: never used
N_AGE = AGES.shape[0] + 1
N_SHORT = 9  # uses in the last 8 accesses: 0..8
N_RANK = 12  # OLED's score: zero, then 1 + halvings below the layer's top score, capped at 10
SKIP = 0.05  # a label predicted within this is not trained on (most experts, at a fraction of the cost)
N_FEAT = 4  # weights read per expert: identity x age, short, OLED score x age, phase x age


def _offsets(num_experts: int) -> np.ndarray:
    """Where each feature's weights start in a layer's weight vector (and the vector's length, last)."""
    sizes = [num_experts * N_AGE, N_SHORT, N_RANK * N_AGE, PHASES * N_AGE]
    return np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)


def _age_table(top: int = 64) -> np.ndarray:
    """``table[age]`` = the age bucket of ``age`` in ``0..top`` (``AGES``'s last edge at ``top`` and above)."""
    return np.array([int(np.searchsorted(AGES, a, side="right")) - 1 for a in range(top + 1)], dtype=np.int64)


AGE_OF = _age_table()
POPCOUNT8 = np.array([bin(b).count("1") for b in range(256)], dtype=np.int64)


@jit
def _features(t, phase, last, bits, score, top, offs, out):
    """The weight indices each expert reads after access ``t`` (``out[e, :N_FEAT]``); ``top`` = max(score, 0)."""
    n_age = AGES.shape[0] + 1
    top_age = AGE_OF.shape[0] - 1
    E = last.shape[0]
    for e in range(E):
        if last[e] < 0:
            a = n_age - 1
        else:
            age = t - last[e]  # >= 0 as ``t`` only grows; clipped anyway: a bad index would read past the table
            a = AGE_OF[0 if age < 0 else age if age < top_age else top_age]
        short = POPCOUNT8[np.int64(bits[e] & np.uint64(0xFF))]
        if score[e] <= 0.0:
            sc = 0
        else:  # halvings below the layer's top score: 1 + floor(log2(top / s)), capped
            sc = 1
            x = score[e] * 2.0
            while sc < N_RANK - 1 and x <= top:
                x *= 2.0
                sc += 1
        out[e, 0] = offs[0] + e * n_age + a
        out[e, 1] = offs[1] + short
        out[e, 2] = offs[2] + sc * n_age + a
        out[e, 3] = offs[3] + phase * n_age + a


@jit
def _observe(layer, counts, t, phase, last_all, bits_all, score, offs, w_all, ring_all, prio_all, reuse_all,
             max_reuse):
    """The critical path of an access of ``layer`` (one call: each costs ~0.15 us per argument, each view made
    in Python ~0.2 us): update the use history, store this access's features in the ring (slot ``t`` mod its
    length), rank every expert with the weights trained so far."""
    last, bits, w, ring = last_all[layer], bits_all[layer], w_all[layer], ring_all[layer]
    E = counts.shape[0]
    for e in range(E):
        used = counts[e] > 0
        bits[e] = (bits[e] << np.uint64(1)) | np.uint64(1 if used else 0)
        if used:
            last[e] = t
    top = 0.0
    for e in range(E):
        top = score[e] if score[e] > top else top
    feats = ring[t % ring.shape[0]]
    _features(t, phase, last, bits, score, top, offs, feats)
    scale = 1e-6 / top if top > 0 else 0.0
    prio, reuse = prio_all[layer], reuse_all[layer]
    for e in range(E):
        z = 0.0
        for f in range(N_FEAT):
            z += w[feats[e, f]]
        age = t - last[e] if last[e] >= 0 else t + 1
        prio[e] = z + scale * score[e] - 1e-9 * age  # ties by OLED's score, then recency
        r = math.exp(z) if z < 30.0 else max_reuse  # p / (1 - p) of p = sigmoid(z)
        reuse[e] = r if r < max_reuse else max_reuse


@jit
def _train(layer, t, horizon, last_all, w_all, g2_all, ring_all, rate):
    """The deferred half of access ``t`` of ``layer``: the access ``t - horizon`` leaves the ring, its labels known
    (used again since: the last use is later); one AdaGrad logistic step on each weight it read, skipping the
    labels it already predicted within ``SKIP``. Its slot is not the one access ``t`` wrote (the ring holds one
    access more than the horizon)."""
    t0 = t - horizon
    if t0 < 0:
        return
    last, w, g2, ring = last_all[layer], w_all[layer], g2_all[layer], ring_all[layer]
    feats = ring[t0 % ring.shape[0]]
    for e in range(last.shape[0]):
        z = 0.0
        for f in range(N_FEAT):
            z += w[feats[e, f]]
        p = 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))
        g = (1.0 if last[e] > t0 else 0.0) - p
        if -SKIP < g < SKIP:
            continue
        for f in range(N_FEAT):
            i = feats[e, f]
            g2[i] += g * g
            w[i] += rate * g / math.sqrt(g2[i] + 1.0)


@register
class LearnedPolicy(CachePolicy):
    """Retention by a reuse predictor learned online from what the past turned out to be (module docstring)."""

    name = "learned"
    tracks_usage = False
    # host time over oled's at LLaDA2.0-mini's shape (eval/planner_speed.py --only mini --mini-percent 25 40, an
    # idle core): the critical path of an access (``plan``: OLED's update, the history, features and ranking, the
    # plan) 1.43-1.65x oled's, and the deferred training (``shadow``) 0.28-0.30 of oled's plan; replay charges a
    # stated planner time scaled by about the upper end of each
    host_cost_scale = 1.6
    deferred_cost_scale = 0.3
    uses_weights = True  # OLED's score, one of the features, reads the gate weights

    def __init__(self, num_layers: int, num_experts: int, horizon: int = 4, rate: float = 0.3,
                 **knobs: Any) -> None:
        super().__init__(num_layers, num_experts, **knobs)
        if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or not 1 <= horizon <= 64:
            raise ValueError(f"learned horizon={horizon!r} is invalid: must be an integer in [1, 64] "
                             "(accesses a label looks ahead)")
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 < float(rate) <= 10.0:
            raise ValueError(f"learned rate={rate!r} is invalid: must be a number in (0, 10] (AdaGrad step)")
        self.horizon, self.rate = int(horizon), float(rate)
        L, E, H = self.num_layers, self.num_experts, self.horizon
        self._oled = OledPolicy(L, E)  # the confidence feature: OLED at its defaults
        self._offs = _offsets(E)
        self._w = np.zeros((L, int(self._offs[-1])))
        self._g2 = np.zeros((L, int(self._offs[-1])))  # AdaGrad: summed squared gradients per weight
        self._t = [0] * L
        self._last = np.full((L, E), -1, dtype=np.int64)
        self._bits = np.zeros((L, E), dtype=np.uint64)  # use history, newest access in bit 0
        self._ring = np.zeros((L, H + 1, E, N_FEAT), dtype=np.int64)  # features of the last H + 1 accesses
        self._prio = np.zeros((L, E))
        self._reuse = np.zeros((L, E))
        self._phase = 0
        self._pending = -1  # the layer whose last access still owes its training (run_shadows), -1: none

    # ------------------------------------------------------------------ events
    def on_block_start(self, block_index: int, token_ids: Any) -> None:
        self.run_shadows()
        self._oled.on_block_start(block_index, token_ids)
        self._phase = 1

    def on_iteration(self, event: Any) -> None:
        self.run_shadows()
        self._oled.on_iteration(event)
        masked = as_numpy(event.masked).reshape(-1)
        share = float(np.count_nonzero(masked)) / max(masked.shape[0], 1)
        self._phase = 5 if share == 0 else 4 if share <= 0.25 else 3 if share <= 0.5 else 2

    def on_block_end(self, block_index: int, token_ids: Any) -> None:
        self.run_shadows()
        self._oled.on_block_end(block_index, token_ids)
        self._phase = 0

    # ------------------------------------------------------------------ routing
    def _update(self, layer: int, ids: np.ndarray, weights: Any, counts: np.ndarray, clock: int) -> None:
        self.run_shadows()  # the previous access's training, if nobody ran it yet
        oled = self._oled
        oled._update(layer, ids, weights, counts, clock)
        t = self._t[layer]
        self._t[layer] = t + 1
        _observe(layer, counts if counts.dtype == np.int64 else counts.astype(np.int64), t, self._phase, self._last,
                 self._bits, oled.priority_array(layer), self._offs, self._w, self._ring, self._prio, self._reuse,
                 MAX_REUSE)
        self._pending = layer

    def run_shadows(self) -> int:
        """The deferred half of the last access: its training step (``_train``), off the critical path.

        The executor runs it once the layer's copies and kernels are issued (``CacheController.run_shadows``);
        left alone it runs before the next access or event, so decisions are the same either way. Returns 1
        if it trained (replay charges ``deferred_cost_scale`` times a stated planner time for it), else 0.
        """
        layer, self._pending = self._pending, -1
        if layer < 0:
            return 0
        _train(layer, self._t[layer] - 1, self.horizon, self._last, self._w, self._g2, self._ring, self.rate)
        return 1

    # ------------------------------------------------------------------ ranking
    def priority_array(self, layer: int) -> np.ndarray:
        return self._prio[layer]

    def reuse_array(self, layer: int) -> np.ndarray:
        return self._reuse[layer]

    def probability(self, layer: int) -> np.ndarray:
        """P(each expert of ``layer`` is used within the next ``horizon`` accesses), as predicted now (a copy)."""
        r = self.reuse_array(layer)
        return r / (1.0 + r)
