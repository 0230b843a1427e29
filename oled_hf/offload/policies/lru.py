"""Per-layer least-recently-used (mixtral-offloading's policy; the classic recency baseline)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import CachePolicy, register


@register
class LRUPolicy(CachePolicy):
    """Priority = clock of the last access that used the expert.

    Experts used in the same access tie on the clock; the tie is broken by the share of the
    access's tokens they served (a fraction < 1, so it never outranks a more recent access).
    """

    name = "lru"

    def __init__(self, num_layers: int, num_experts: int, **knobs: Any) -> None:
        super().__init__(num_layers, num_experts, **knobs)
        self._last = np.full((self.num_layers, self.num_experts), -1.0)

    def _update(self, layer: int, ids: np.ndarray, weights: Any, counts: np.ndarray, clock: int) -> None:
        used = counts > 0
        self._last[layer][used] = clock + 0.5 * counts[used] / (np.maximum.reduce(counts) + 1.0)

    def priority_array(self, layer: int) -> np.ndarray:
        return self._last[layer]

    def on_admitted(self, layer: int, experts: np.ndarray, clock: int) -> None:
        # admitted ahead of use (a prefetch): most recently used as of now, below the experts the
        # access itself will use (clock + share)
        self._last[layer][experts] = np.maximum(self._last[layer][experts], float(clock))


@register
class PrefetchPolicy(LRUPolicy):
    """The legacy policy name ``prefetch``: LRU retention; its next-layer prefetch is the ``gate``
    prefetcher part (``policies/prefetch.py``), composed by the ``prefetch`` system preset."""

    name = "prefetch"
