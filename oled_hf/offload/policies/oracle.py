"""Oracle retention for the report's ladder (replay only): what a policy could gain by knowing the future.

Each rung is the retention part of a system timed under the same dispatch and allocation as the
others, so the TPOT gap between two rungs is the value of what the better one knows:

* ``belady``: evicts the resident used furthest in the future (Belady's MIN as a priority:
  ``-next_use``); never-again experts go first.
* ``next-oracle``: knows exactly the next access's expert set of each layer and nothing further: experts
  of that set are kept first, the rest by recency (LRU). The headroom of a perfect next-iteration
  predictor, which is what confidence-guided retention tries to be.
* ``belady-reuse``: ``belady``'s retention, and the dispatcher's admission reads the future too: an
  expert's predicted reuse is the run of its next uses it would be held for, each counted while
  fewer than the layer's ``C`` slots' worth of other experts are used before it (its *forward
  distance*, the number of distinct experts of the layer used between now and its next use, which
  is its rank in Belady's next-use order; an expert ranked below ``C`` is the kind Belady keeps),
  ``R[t, e] = [rank_t(e) < C] * (1 + R[next_t(e), e])``, capped at ``MAX_REUSE``. The dispatcher's
  admission reads it: rule 4's reuse copies (dispatch ``cpu+reuse``, the ladder's fair dispatch)
  copy the CPU-served misses of exact reuse >= ``reuse_min``; the amortised split (``cpu``) copies a
  miss where the CPU time its exact reuse saves pays for the copy. The Belady rung with cost-aware
  admission. Approximate in one way, stated: Belady with CPU bypass does not fill its cache with
  every miss, so a copy may outlive ``C`` distinct uses.
* ``lru-reuse``: LRU's retention with the same exact reuse: what a perfect admission predictor adds
  to an online retention.
* ``foresight`` (knob ``horizon`` = K >= 1): Belady within the next K accesses of each layer, LRU
  beyond (an expert used within K accesses outranks every other, the sooner the higher). The
  ladder's rungs ``foresight-K`` say how far ahead the value of retention lies: K = 1 is about
  ``next-oracle``, K = the trace's length is ``belady``.
* ``previous-set``: no future; keeps the previous access's set first, then LRU (a demand cache holds
  the current set anyway, so among evictable experts this is LRU except where a request exceeds the
  cache).

The future is the trace's: ``future`` is one bool matrix per MoE layer, ``[accesses, num_experts]``,
row t the experts access t of that layer uses (``list(sim.belady.request_sets(trace))``; ``next_use`` is
kept here because the offload layer does not import the simulator). The policy counts its own
accesses per layer and checks each against its row, so a future that does not belong to the run
raises instead of timing nonsense. Only ``belady-reuse`` and ``lru-reuse`` let the dispatcher know the future too;
the others' reuse estimate is the base policy's (usage EMA), as for every other retention part.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import MAX_REUSE, register
from .lru import LRUPolicy
from .phase import KEEP_FIRST


def next_use(used: np.ndarray) -> np.ndarray:
    """``[accesses, E]`` int: the index of the next access after t that uses each expert (a large
    number when none does), from one reverse scan."""
    n, e = used.shape
    out = np.empty((n, e), dtype=np.int64)
    upcoming = np.full(e, np.iinfo(np.int32).max, dtype=np.int64)
    for t in range(n - 1, -1, -1):
        out[t] = upcoming
        upcoming = np.where(used[t], t, upcoming)
    return out


def forward_rank(nxt: np.ndarray) -> np.ndarray:
    """``[accesses, E]``: per row, how many experts have a strictly earlier next use than each one
    (the number of distinct experts used between the access and that expert's next use)."""
    ordered = np.sort(nxt, axis=1)
    out = np.zeros(nxt.shape, dtype=np.int64)
    for t in range(nxt.shape[0]):
        out[t] = np.searchsorted(ordered[t], nxt[t], side="left")
    return out


def held_reuse(nxt: np.ndarray, rank: np.ndarray, capacity: int) -> np.ndarray:
    """``[accesses, E]``: the run of next uses each expert is held for at ``capacity`` slots
    (``R[t, e] = [rank < capacity] * (1 + R[next, e])``, one backward scan), capped at ``MAX_REUSE``."""
    n, e = nxt.shape
    out = np.zeros((n + 1, e))
    cols = np.arange(e)
    for t in range(n - 1, -1, -1):
        ahead = np.minimum(nxt[t], n)  # a next use past the trace reads the zero row
        kept = (rank[t] < capacity) & (nxt[t] < n)
        out[t] = np.where(kept, 1.0 + out[ahead, cols], 0.0)
    return np.minimum(out[:n], MAX_REUSE)


class _FuturePolicy(LRUPolicy):
    """LRU plus a per-layer access counter checked against the known future."""

    def __init__(self, num_layers: int, num_experts: int, future: list[np.ndarray] | None = None,
                 **knobs: Any) -> None:
        if future is None:
            raise ValueError(f"retention {self.name!r} is an oracle for trace replay only: it needs the trace's "
                             "future (knob retention.future = list(sim.belady.request_sets(trace)))")
        super().__init__(num_layers, num_experts, **knobs)
        if len(future) != self.num_layers or any(f.shape[1] != self.num_experts for f in future):
            raise ValueError(f"retention.future has {len(future)} layers; the run has {self.num_layers} MoE layers "
                             f"of {self.num_experts} experts")
        self.future = future
        self._t = np.full(self.num_layers, -1, dtype=np.int64)
        self._prio = np.zeros((self.num_layers, self.num_experts))
        self._next = [next_use(f) for f in self.future]
        self._rank: list[np.ndarray] | None = None  # forward ranks, built on the first exact-reuse question
        self._held: dict[int, tuple[int, np.ndarray]] = {}  # layer -> (capacity, table): the latest only

    def held_reuse_row(self, layer: int) -> np.ndarray:
        """The exact reuse of every expert of ``layer`` at its current access (``held_reuse`` at the layer's
        current slot count)."""
        if self._rank is None:
            self._rank = [forward_rank(n) for n in self._next]
        cap = self.num_experts if self.capacities is None else int(self.capacities[layer])
        held = self._held.get(layer)
        if held is None or held[0] != cap:
            held = self._held[layer] = (cap, held_reuse(self._next[layer], self._rank[layer], cap))
        return held[1][max(self._t[layer], 0)]

    def _update(self, layer: int, ids: np.ndarray, weights: Any, counts: np.ndarray, clock: int) -> None:
        super()._update(layer, ids, weights, counts, clock)
        t = self._t[layer] = self._t[layer] + 1
        rows = self.future[layer]
        if t >= rows.shape[0] or not np.array_equal(rows[t], counts > 0):
            raise ValueError(f"retention {self.name!r}: access {t} of MoE layer {layer} does not match the future "
                             "it was given (a future of another trace, or of another warm-up)")


@register
class BeladyPolicy(_FuturePolicy):
    name = "belady"

    def priority_array(self, layer: int) -> np.ndarray:
        np.negative(self._next[layer][max(self._t[layer], 0)], out=self._prio[layer], casting="unsafe")
        return self._prio[layer]


class _ExactReuse:
    """Mixin (first base): the dispatcher's predicted reuse is the exact run of uses a copy is held for."""

    tracks_usage = False

    def reuse_array(self, layer: int) -> np.ndarray:
        return self.held_reuse_row(layer)  # type: ignore[attr-defined]  (a _FuturePolicy's)


@register
class BeladyReusePolicy(_ExactReuse, BeladyPolicy):
    """Belady's retention with the exact reuse: Belady with cost-aware admission."""

    name = "belady-reuse"


@register
class LRUReusePolicy(_ExactReuse, _FuturePolicy):
    """LRU's retention with the exact reuse: what a perfect admission predictor adds to an online retention."""

    name = "lru-reuse"


@register
class ForesightPolicy(_FuturePolicy):
    name = "foresight"

    def __init__(self, num_layers: int, num_experts: int, future: list[np.ndarray] | None = None, horizon: int = 4,
                 **knobs: Any) -> None:
        if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or horizon < 1:
            raise ValueError(f"foresight horizon={horizon!r} is invalid: must be an integer >= 1 (accesses ahead)")
        super().__init__(num_layers, num_experts, future, **knobs)
        self.horizon = int(horizon)

    def priority_array(self, layer: int) -> np.ndarray:
        t = max(self._t[layer], 0)
        ahead = self._next[layer][t] - t
        np.copyto(self._prio[layer], np.where(ahead <= self.horizon, KEEP_FIRST - ahead, self._last[layer]))
        return self._prio[layer]


@register
class NextOraclePolicy(_FuturePolicy):
    name = "next-oracle"

    def priority_array(self, layer: int) -> np.ndarray:
        t, rows = self._t[layer], self.future[layer]
        nxt = rows[t + 1] if 0 <= t + 1 < rows.shape[0] else np.zeros(self.num_experts, dtype=bool)
        np.add(self._last[layer], KEEP_FIRST * nxt, out=self._prio[layer])
        return self._prio[layer]


@register
class PreviousSetPolicy(LRUPolicy):
    """The previous access's set first, then recency; no future (a rung of the ladder, not an oracle)."""

    name = "previous-set"

    def __init__(self, num_layers: int, num_experts: int, **knobs: Any) -> None:
        super().__init__(num_layers, num_experts, **knobs)
        self._prev = np.zeros((self.num_layers, self.num_experts), dtype=bool)
        self._cur = np.zeros((self.num_layers, self.num_experts), dtype=bool)
        self._prio = np.zeros((self.num_layers, self.num_experts))

    def _update(self, layer: int, ids: np.ndarray, weights: Any, counts: np.ndarray, clock: int) -> None:
        super()._update(layer, ids, weights, counts, clock)
        self._prev[layer] = self._cur[layer]
        self._cur[layer] = counts > 0

    def priority_array(self, layer: int) -> np.ndarray:
        np.add(self._last[layer], KEEP_FIRST * self._prev[layer], out=self._prio[layer])
        return self._prio[layer]
