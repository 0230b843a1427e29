"""Prefetchers, one part of a system: which experts of the next layer to copy ahead of its access.

A prefetcher knows nothing of the retention policy, the dispatch or the allocation: it hears the
routing (``observe_access``) and the block starts, and names the experts of layer l+1 to copy while
layer l computes (``prefetch_for``, best first). Replay (``oled_hf.sim.replay``) copies them on the
copy engine and tells the retention policy which experts were admitted ahead of use
(``CachePolicy.on_admitted``), so that the policy can rank them as it sees fit. A live ``generate``
runs the same decision (``CacheController.prefetch``) and issues the copies at low priority on the
device's copy engine (``oled_hf.offload.executor``); the gate prefetchers need the next layer's
predicted routes, which only a recorded trace holds, so they run in replay only.

* ``gate`` (``GatePrefetcher``): layer l+1's router applied to the hidden state leaving layer l
  predicts its experts (recorded in version-2 traces, ``Trace.predicted_routing``); the predicted
  experts, most tokens first, up to the layer's capacity, queue FIFO with demand copies. The
  speculative loading of Mixtral-offloading (arXiv 2312.17238) and Pre-gated MoE (2308.12066).
* ``gate-capped`` (ProMoE-style, arXiv 2410.22134; HybriMoE's impact-driven prefetch, 2504.05897):
  the same prediction, capped by predicted benefit: only as many as can start on the copy engine
  before layer l+1 plans (replay passes that ``budget``: a copy starting later saves nothing over
  its demand copy), and demand copies go first on the copy engine (a queued prefetch that has
  not started yields).
* ``previous`` (``PreviousPrefetcher``): layer l+1 will route nearly as it did one iteration ago
  (adjacent denoising iterations route nearly the same experts), so its previous access's experts
  that are not resident now (most tokens first) are copied into the copy engine's idle time: capped
  and demand-first as ``gate-capped``, but it needs no predicted routes, only what the layer routed
  and what the cache holds.
* ``matrix`` (``MatrixPrefetcher``, MoE-Infinity, arXiv 2401.14361): the request's expert
  activation matrix (tokens per layer and expert so far) is matched to the closest (cosine)
  matrix of a completed request; the experts of highest activation ratio in (current + matched),
  as many as the layer used in its previous access. Needs no predicted routes.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

PREFETCHERS = ("none", "gate", "gate-capped", "previous", "matrix")
# a live generate has no predicted routes of the next layer (only a recorded trace holds them)
REPLAY_ONLY_PREFETCHERS = ("gate", "gate-capped")
LIVE_PREFETCHERS = tuple(p for p in PREFETCHERS[1:] if p not in REPLAY_ONLY_PREFETCHERS)


def ranked(scores: np.ndarray, limit: int) -> np.ndarray:
    """Indices of the positive scores, highest first (ties: lower id), at most ``limit``."""
    idx = np.flatnonzero(scores > 0)
    order = np.lexsort((idx, -scores[idx]))
    return idx[order][: max(int(limit), 0)]


class Prefetcher:
    """Interface of the prefetch part (the base prefetches nothing)."""

    name: ClassVar[str] = "none"
    uses_predicted_routes: ClassVar[bool] = False  # needs a version-2 trace
    demand_first: ClassVar[bool] = False  # demand copies overtake this prefetcher's queued copies
    capped: ClassVar[bool] = False  # prefetch_for honours ``budget`` (copies that can land in time)

    def __init__(self, num_layers: int, num_experts: int, **knobs: Any) -> None:
        if knobs:
            raise TypeError(f"{type(self).__name__} got unknown knobs: {', '.join(sorted(knobs))}")
        self.num_layers, self.num_experts = int(num_layers), int(num_experts)

    def observe_access(self, layer: int, counts: np.ndarray, clock: int) -> None:
        """Tokens per expert of one layer access (after it was planned)."""

    def on_block_start(self, block_index: int) -> None:
        """A new block of the current sequence (a lower index than the last starts a new request)."""

    def prefetch_for(self, layer: int, predicted_counts: np.ndarray | None, capacity: int,
                     budget: int | None = None, resident: np.ndarray | None = None) -> np.ndarray:
        """Experts of ``layer`` to copy ahead, best first (at most ``capacity``; ``budget`` where capped).

        ``resident``: the layer's residency now (bool ``[E]``), for a prefetcher that spends its budget on
        copies only; the cache skips resident experts either way."""
        return np.zeros(0, dtype=np.int64)


class GatePrefetcher(Prefetcher):
    """Next-layer gate prediction, most predicted tokens first (``limit``: at most this many)."""

    name = "gate"
    uses_predicted_routes = True

    def __init__(self, num_layers: int, num_experts: int, limit: int | None = None, **knobs: Any) -> None:
        super().__init__(num_layers, num_experts, **knobs)
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise ValueError(f"prefetch limit={limit!r} is invalid: must be an integer >= 1 or None (capacity)")
        self.limit = limit

    def prefetch_for(self, layer: int, predicted_counts: np.ndarray | None, capacity: int,
                     budget: int | None = None, resident: np.ndarray | None = None) -> np.ndarray:
        if predicted_counts is None:
            return np.zeros(0, dtype=np.int64)
        n = capacity if self.limit is None else min(capacity, self.limit)
        if self.capped and budget is not None:
            n = min(n, budget)
        return ranked(np.asarray(predicted_counts, dtype=np.float64), n)


class CappedGatePrefetcher(GatePrefetcher):
    """ProMoE-style: the gate prediction capped by what can land in time; demand copies first."""

    name = "gate-capped"
    demand_first = True
    capped = True


class PreviousPrefetcher(Prefetcher):
    """The layer's previous access, its non-resident experts most tokens first, capped by what starts in time."""

    name = "previous"
    demand_first = True
    capped = True

    def __init__(self, num_layers: int, num_experts: int, **knobs: Any) -> None:
        super().__init__(num_layers, num_experts, **knobs)
        self._previous = np.zeros((self.num_layers, self.num_experts))

    def observe_access(self, layer: int, counts: np.ndarray, clock: int) -> None:
        self._previous[layer] = counts

    def prefetch_for(self, layer: int, predicted_counts: np.ndarray | None, capacity: int,
                     budget: int | None = None, resident: np.ndarray | None = None) -> np.ndarray:
        scores = self._previous[layer] if resident is None else np.where(resident, 0.0, self._previous[layer])
        return ranked(scores, capacity if budget is None else min(capacity, budget))


class ActivationMatrix:
    """MoE-Infinity's expert activation matrix (EAM) per request and its library of finished ones.

    Shared by the ``moe-infinity`` retention policy (priority eviction) and the ``matrix``
    prefetcher, each holding its own instance (the parts share code, not state).
    """

    def __init__(self, num_layers: int, num_experts: int, library_size: int = 256) -> None:
        self.library_size = int(library_size)
        self.eam = np.zeros((num_layers, num_experts))
        self.library: list[np.ndarray] = []  # row-normalised EAMs of completed requests
        self._matched: np.ndarray | None = None
        self._matched_clock = -1
        self._last_block = -1

    @staticmethod
    def rows(eam: np.ndarray) -> np.ndarray:
        return eam / np.maximum(eam.sum(axis=1, keepdims=True), 1e-12)

    def add(self, layer: int, counts: np.ndarray) -> None:
        self.eam[layer] += counts

    def block_start(self, block_index: int) -> None:
        if block_index <= self._last_block and self.eam.any():  # a new request: file the finished one
            self.library.append(self.rows(self.eam))
            self.library = self.library[-self.library_size:]
            self.eam[:] = 0.0
            self._matched_clock = -1
        self._last_block = block_index

    def match(self, clock: int) -> np.ndarray | None:
        """The library EAM closest (cosine) to the current one; once per forward."""
        if clock != self._matched_clock:
            self._matched_clock = clock
            self._matched = None
            if self.library and self.eam.any():
                cur = self.rows(self.eam).reshape(-1)
                lib = np.stack(self.library).reshape(len(self.library), -1)
                sim = lib @ cur / (np.linalg.norm(lib, axis=1) * np.linalg.norm(cur) + 1e-12)
                self._matched = self.library[int(np.argmax(sim))]
        return self._matched

    def score(self, layer: int, clock: int | None = None) -> np.ndarray:
        """Activation ratio of the layer's experts: current request's, plus the matched request's."""
        cur = self.eam[layer] / max(float(self.eam[layer].sum()), 1e-12)
        matched = self.match(clock) if clock is not None else self._matched
        return cur if matched is None else cur + matched[layer]


class MatrixPrefetcher(Prefetcher):
    """MoE-Infinity's activation-matrix prefetch (see the module docstring)."""

    name = "matrix"

    def __init__(self, num_layers: int, num_experts: int, library_size: int = 256, **knobs: Any) -> None:
        super().__init__(num_layers, num_experts, **knobs)
        self.matrix = ActivationMatrix(num_layers, num_experts, library_size)
        self._last_unique = np.zeros(self.num_layers, dtype=np.int64)
        self._clock = 0

    def observe_access(self, layer: int, counts: np.ndarray, clock: int) -> None:
        self.matrix.add(layer, counts)
        self._last_unique[layer] = int(np.count_nonzero(counts))
        self._clock = clock

    def on_block_start(self, block_index: int) -> None:
        self.matrix.block_start(block_index)

    def prefetch_for(self, layer: int, predicted_counts: np.ndarray | None, capacity: int,
                     budget: int | None = None, resident: np.ndarray | None = None) -> np.ndarray:
        n = min(int(self._last_unique[layer]) or capacity, capacity)
        return ranked(self.matrix.score(layer, self._clock), n)


_PREFETCHERS: dict[str, type[Prefetcher]] = {
    "none": Prefetcher, "gate": GatePrefetcher, "gate-capped": CappedGatePrefetcher, "previous": PreviousPrefetcher,
    "matrix": MatrixPrefetcher,
}


def make_prefetcher(name: str, num_layers: int, num_experts: int, **knobs: Any) -> Prefetcher | None:
    """The prefetch part by name (None for ``none``)."""
    if name not in _PREFETCHERS:
        raise ValueError(f"prefetch={name!r} is unknown; allowed: {', '.join(PREFETCHERS)}")
    return None if name == "none" else _PREFETCHERS[name](num_layers, num_experts, **knobs)
