"""Horizon-calibrated reuse (``horizon``): a base retention's ranking, with the reuse a copy will earn learned online.

Why. The dispatcher's amortised split (dispatch ``cpu``) copies a miss when ``copy_time / (1 +
reuse)`` of GPU-side work beats the CPU time it saves, so everything hangs on ``reuse``: the
further accesses the copy serves *before it is evicted*. The base policy's ``u / (1 - u)`` (``u``
a usage EMA) counts uses with no regard to how long the cache can hold the expert: at 15% of
expert memory a copy lives a few accesses and that estimate over-copies (two thirds of the copies
die unused); at 40% it lives long. On the dev traces the greedy offline schedule
(``oled_hf.sim.schedules.greedy``, Belady retention) copies only misses whose next use comes soon (median
reuse distance 1 access) and serves the rest on the CPU. The online analogue: learn, per layer
and per bin of the usage EMA, how often an expert's next use falls within the horizon the cache
holds it, and feed that to the split.

The algorithm, per MoE layer with ``C`` slots (the planner's current allocation):

* State: the base policy's (it hears every access and decoder event and answers ``priority``);
  ``u_e``, the usage EMA (``usage_decay``); ``last_e``, the clock of ``e``'s last use; a pending
  mark per expert (a use whose outcome is not known yet) with the bin of ``u_e`` it was made in;
  per bin ``b`` decayed counts ``s_b`` (outcomes that were reuses within the horizon) and ``n_b``.
* Horizon: the expert's *stack distance*, the number of distinct experts of the layer used since
  its last use (under LRU a cached expert is evicted once ``C`` others were used since). A pending
  use succeeds if the next use comes at stack distance ``< scale * C``, fails once the distance
  reaches it (``scale`` > 1: CPU-served misses do not enter the cache, so residency outlasts ``C``).
* Per access: resolve the pending uses (used now at distance ``< H``: success; distance ``>= H``:
  failure), ``s, n <- calib_decay * (s, n) + outcomes`` per bin; update ``u``; every used expert
  becomes pending in the bin of its new ``u``.
* Predicted reuse (the split's amortisation and rule 4's ``reuse_min``): with ``p_b = (s_b +
  prior_n * centre_b) / (n_b + prior_n)`` (a prior at the bin's centre, so an untrained bin says
  what ``u / (1 - u)`` says), ``reuse_e = p / (1 - p)``, capped: the expected run of hits.
* Admission (``admit_min`` > 0; off at 0): a miss may take a slot only if its ``p`` is at least
  ``admit_min``, else it runs on the CPU. The greedy offline schedule never copies an expert it
  will not use again; this is the online version of that rule.
* Priority: the base policy's (``base``: one of ``BASES``); retention is not changed.

Measured (a study since removed, see docs/report.md; mini experts
on H200 + PCIe 5): it does not beat ``oled``. The learned chance is high (0.66-0.96 per bin at 40 %),
and fed undiscounted to the amortised split it over-copies (5.4 copies per access against 4.0 for
``lru+cpu``; 4.62x against 3.55x fused on mini-like dev s1 at 40 %): a reuse saves less than the
split's ``copy_time / (1 + reuse)`` credits when the copy engine is saturated and the next miss
would run on the CPU in parallel. Discounted (``discount`` 0.1) it is within 0.5 % of ``oled`` at
15/25 % and 6-9 % slower at 40 %; the admission floor changes nothing (every requested expert's
usage EMA is at least ``1 - usage_decay``, and that bin already reuses 66-80 % of the time).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import CachePolicy, geometric_reuse, register

BASES = ("lru", "oled", "value", "lfu", "score")


@register
class HorizonPolicy(CachePolicy):
    """A base policy's priority; reuse = the learned chance of a reuse within the cache's horizon (module doc)."""

    name = "horizon"

    def __init__(self, num_layers: int, num_experts: int, base: str = "lru", scale: float = 1.0, bins: int = 8,
                 calib_decay: float = 0.995, prior_n: float = 8.0, usage_decay: float = 0.8, admit_min: float = 0.0,
                 discount: float = 1.0, **knobs: Any) -> None:
        super().__init__(num_layers, num_experts, **knobs)
        from . import make_policy

        if base not in BASES:
            raise ValueError(f"horizon base={base!r} is unknown; allowed: {', '.join(BASES)}")
        if not float(scale) > 0:
            raise ValueError(f"horizon scale={scale!r} is invalid: must be a number > 0 (times the slots)")
        if isinstance(bins, bool) or not isinstance(bins, int) or not 1 <= bins <= 64:
            raise ValueError(f"horizon bins={bins!r} is invalid: must be an integer in [1, 64]")
        for name, v in (("calib_decay", calib_decay), ("usage_decay", usage_decay), ("admit_min", admit_min)):
            if not 0.0 <= float(v) < 1.0:
                raise ValueError(f"horizon {name}={v!r} is invalid: must be a number in [0, 1)")
        if not float(prior_n) > 0:
            raise ValueError(f"horizon prior_n={prior_n!r} is invalid: must be a number > 0")
        if not float(discount) > 0:
            raise ValueError(f"horizon discount={discount!r} is invalid: must be a number > 0")
        self.admit_min, self.discount = float(admit_min), float(discount)
        self._admit = np.ones((self.num_layers, self.num_experts), dtype=bool)
        self.base = make_policy(base, num_layers, num_experts)
        self.uses_weights = self.base.uses_weights
        self.scale, self.bins = float(scale), int(bins)
        self.calib_decay, self.prior_n, self.usage_decay = float(calib_decay), float(prior_n), float(usage_decay)
        shape = (self.num_layers, self.num_experts)
        self._last = np.full(shape, -1.0)
        self._pending = np.zeros(shape, dtype=bool)
        self._pend_bin = np.zeros(shape, dtype=np.int64)
        self._stats = np.zeros((self.num_layers, 2, self.bins))  # [successes, outcomes] per bin
        self._centre = (np.arange(self.bins) + 0.5) / self.bins
        self._p = np.tile(self._centre, (self.num_layers, 1))

    # the base policy hears everything the planner and the decoder say
    def set_capacities(self, capacities: list[int]) -> None:
        super().set_capacities(capacities)
        self.base.set_capacities(capacities)

    def on_block_start(self, block_index: int, token_ids: Any) -> None:
        self.base.on_block_start(block_index, token_ids)

    def on_iteration(self, event: Any) -> None:
        self.base.on_iteration(event)

    def on_block_end(self, block_index: int, token_ids: Any) -> None:
        self.base.on_block_end(block_index, token_ids)

    def on_admitted(self, layer: int, experts: np.ndarray, clock: int) -> None:
        self.base.on_admitted(layer, experts, clock)

    def _bin(self, u: np.ndarray) -> np.ndarray:
        return np.minimum((u * self.bins).astype(np.int64), self.bins - 1)

    def _distances(self, last: np.ndarray) -> np.ndarray:
        """Per expert, the number of distinct experts used after its last use (its LRU stack distance)."""
        return self.num_experts - np.searchsorted(np.sort(last), last, side="right")

    def _update(self, layer: int, ids: np.ndarray, weights: Any, counts: np.ndarray, clock: int) -> None:
        used = counts > 0
        last, pending = self._last[layer], self._pending[layer]
        cap = self.num_experts if self.capacities is None else int(self.capacities[layer])
        horizon = self.scale * cap
        dist = self._distances(last)  # before this access: a used expert's distance to its last use
        win = pending & used & (dist < horizon)
        done = pending & used
        last[used] = float(clock)
        dist = self._distances(last)  # after it: how far an unused pending expert has drifted
        lose = pending & ~used & (dist >= horizon)
        stats = self._stats[layer]
        stats *= self.calib_decay
        b = self._pend_bin[layer]
        stats[0] += np.bincount(b[win], minlength=self.bins)
        stats[1] += np.bincount(b[done | lose], minlength=self.bins)
        pending[lose] = False
        self._p[layer] = (stats[0] + self.prior_n * self._centre) / (stats[1] + self.prior_n)
        pending[used] = True
        self._pend_bin[layer][used] = self._bin(self._usage[layer][used])  # the EMA after this access
        self.base.observe_access(layer, ids, weights, clock, counts)

    def priority_array(self, layer: int) -> np.ndarray:
        return self.base.priority_array(layer)

    def reuse_array(self, layer: int) -> np.ndarray:
        out = geometric_reuse(self._p[layer][self._bin(self._usage[layer])])
        if self.discount != 1.0:
            out *= self.discount
        return out

    def admission(self, layer: int) -> np.ndarray | None:
        if self.admit_min <= 0.0:
            return None
        return np.greater_equal(self._p[layer][self._bin(self._usage[layer])], self.admit_min, out=self._admit[layer])

    def hit_chance(self, layer: int) -> np.ndarray:
        """The learned chance, per bin of the usage EMA, that a use is followed by one within the horizon."""
        return self._p[layer].copy()
