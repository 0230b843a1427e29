"""MoE-Infinity's priority eviction (the ``moe-infinity`` retention policy).

Models MoE-Infinity (arXiv 2401.14361; ``EfficientMoE/MoE-Infinity``): each request keeps an
*expert activation matrix* (EAM: tokens routed per layer and expert so far); completed requests'
EAMs form a library; eviction keeps the experts with the highest activation ratio in (current +
closest library EAM) (the repo's default ``priority`` policy). Adapted to block diffusion: a
request is one generated sequence (a new one starts when the block index stops increasing) and
its EAM counts every forward's routing. Its prefetch is a separate part, the ``matrix`` prefetcher
(``policies/prefetch.py``), composed with this policy by the ``moe-infinity`` system preset.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import CachePolicy, register
from .prefetch import ActivationMatrix


@register
class MoEInfinityPolicy(CachePolicy):
    """Request-level EAM; eviction by activation ratio, ties by recency."""

    name = "moe-infinity"
    tracks_usage = True

    def __init__(self, num_layers: int, num_experts: int, library_size: int = 256, **knobs: Any) -> None:
        super().__init__(num_layers, num_experts, **knobs)
        self.matrix = ActivationMatrix(self.num_layers, self.num_experts, library_size)
        self._prio = np.zeros((self.num_layers, self.num_experts))
        self._last = np.zeros((self.num_layers, self.num_experts))
        self._clock = 0

    def _update(self, layer: int, ids: np.ndarray, weights: Any, counts: np.ndarray, clock: int) -> None:
        self.matrix.add(layer, counts)
        np.copyto(self._last[layer], float(clock), where=counts > 0)
        self._clock = clock

    def on_block_start(self, block_index: int, token_ids: Any) -> None:
        self.matrix.block_start(block_index)

    def priority_array(self, layer: int) -> np.ndarray:
        # activation ratio, ties by recency (a fraction < any ratio step is not guaranteed; tie-break only)
        np.add(self.matrix.score(layer, self._clock), 1e-9 * self._last[layer], out=self._prio[layer])
        return self._prio[layer]
