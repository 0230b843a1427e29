"""Per-layer least-frequently-used: counts accesses (not tokens) per expert since the start."""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import CachePolicy, register


@register
class LFUPolicy(CachePolicy):
    """Priority = number of accesses that used the expert, ties broken by recency.

    Frequency counts unique use per access, the unit hits are counted in, so a popular expert is
    not over-weighted by how many tokens of one block happened to pick it.
    """

    name = "lfu"

    def __init__(self, num_layers: int, num_experts: int, **knobs: Any) -> None:
        super().__init__(num_layers, num_experts, **knobs)
        self._freq = np.zeros((self.num_layers, self.num_experts))
        self._last = np.zeros((self.num_layers, self.num_experts))
        self._clock = 0

    def _update(self, layer: int, ids: np.ndarray, weights: Any, counts: np.ndarray, clock: int) -> None:
        used = counts > 0
        np.add(self._freq[layer], 1.0, out=self._freq[layer], where=used)  # = freq[used] += 1, one call
        np.copyto(self._last[layer], clock + 1.0, where=used)
        self._clock = max(self._clock, clock + 1)

    def priority_array(self, layer: int) -> np.ndarray:
        return self._freq[layer] + self._last[layer] / (self._clock + 1.0)
