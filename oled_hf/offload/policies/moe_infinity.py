"""MoE-Infinity's activation-aware prefetch and priority eviction (the moe-infinity baseline).

Models MoE-Infinity (arXiv 2401.14361; ``EfficientMoE/MoE-Infinity``): each request keeps an
*expert activation matrix* (EAM: tokens routed per layer and expert so far); completed requests'
EAMs form a library. Before a layer runs, the current EAM is matched to the closest library EAM
(cosine similarity) and the experts with the highest activation ratio in (current + matched) EAM
are prefetched; eviction keeps the experts with the highest such ratio ("priority", the repo's
default policy). Adapted to block diffusion: a request is one generated sequence (a new one starts
when the block index stops increasing), its EAM counts every forward's routing, and a layer
prefetches as many experts as it used in its previous access (MoE-Infinity prefetches the
predicted activation set of the next layers; here the next layer only, as in ``prefetch``).
Needs no predicted routes, so it also runs on version-1 traces; live it is priority eviction only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import CachePolicy, register
from .prefetch import Prefetcher, ranked


@register
class MoEInfinityPolicy(CachePolicy, Prefetcher):
    """Request-level EAM + closest-prior-EAM prefetch; eviction by activation ratio."""

    name = "moe-infinity"
    tracks_usage = True

    def __init__(self, num_layers: int, num_experts: int, library_size: int = 256, **knobs: Any) -> None:
        super().__init__(num_layers, num_experts, **knobs)
        self.library_size = int(library_size)
        self._eam = np.zeros((self.num_layers, self.num_experts))
        self._library: list[np.ndarray] = []  # row-normalised EAMs of completed requests
        self._matched: np.ndarray | None = None
        self._matched_clock = -1
        self._last_unique = np.zeros(self.num_layers, dtype=np.int64)
        self._last_block = -1
        self._prio = np.zeros((self.num_layers, self.num_experts))
        self._last = np.zeros((self.num_layers, self.num_experts))

    @staticmethod
    def _rows(eam: np.ndarray) -> np.ndarray:
        return eam / np.maximum(eam.sum(axis=1, keepdims=True), 1e-12)

    def _update(self, layer: int, ids: np.ndarray, weights: Any, counts: np.ndarray, clock: int) -> None:
        self._eam[layer] += counts
        self._last_unique[layer] = int(np.count_nonzero(counts))
        np.copyto(self._last[layer], float(clock), where=counts > 0)

    def on_block_start(self, block_index: int, token_ids: Any) -> None:
        if block_index <= self._last_block and self._eam.any():  # a new request: file the finished one
            self._library.append(self._rows(self._eam))
            self._library = self._library[-self.library_size:]
            self._eam[:] = 0.0
            self._matched_clock = -1
        self._last_block = block_index

    def _match(self, clock: int) -> np.ndarray | None:
        """The library EAM closest (cosine) to the current one; once per forward."""
        if clock != self._matched_clock:
            self._matched_clock = clock
            self._matched = None
            if self._library and self._eam.any():
                cur = self._rows(self._eam).reshape(-1)
                lib = np.stack(self._library).reshape(len(self._library), -1)
                sim = lib @ cur / (np.linalg.norm(lib, axis=1) * np.linalg.norm(cur) + 1e-12)
                self._matched = self._library[int(np.argmax(sim))]
        return self._matched

    def _score(self, layer: int, clock: int | None = None) -> np.ndarray:
        cur = self._eam[layer] / max(float(self._eam[layer].sum()), 1e-12)
        matched = self._match(clock) if clock is not None else self._matched
        return cur if matched is None else cur + matched[layer]

    def priority_array(self, layer: int) -> np.ndarray:
        # activation ratio, ties by recency (a fraction < any ratio step is not guaranteed; tie-break only)
        np.add(self._score(layer), 1e-9 * self._last[layer], out=self._prio[layer])
        return self._prio[layer]

    def prefetch_for(self, layer: int, predicted_counts: np.ndarray | None, capacity: int) -> np.ndarray:
        n = min(int(self._last_unique[layer]) or capacity, capacity)
        clock = int(self._last.max()) if self._last.size else 0
        return ranked(self._score(layer, clock), n)
