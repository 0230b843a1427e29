"""Next-layer speculative prefetch with LRU eviction (the prefetch baseline).

Models the comparison class of Mixtral-offloading (speculative expert loading, arXiv 2312.17238),
Pre-gated MoE (arXiv 2308.12066), ProMoE (arXiv 2410.22134) and HybriMoE (arXiv 2504.05897): while
layer l computes, layer l+1's router applied to the hidden state leaving layer l predicts layer
l+1's experts, and those not resident are copied ahead on the copy engine; eviction is per-layer
LRU (mixtral-offloading's cache). Mispredictions cost PCIe bandwidth and slots.

The predictions come from version-2 traces (``Trace.predicted_routing``), so this policy prefetches
in replay only; live it behaves as ``lru``. Prefetching is the small :class:`Prefetcher` protocol
that replay drives: ``prefetch_for`` names the experts to copy ahead for a layer (best first),
``on_prefetched`` tells the policy which ones were copied.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from .base import register
from .lru import LRUPolicy


class Prefetcher:
    """Mixin for policies that copy experts ahead of their layer (driven by ``oled_hf.sim.replay``)."""

    uses_predicted_routes: ClassVar[bool] = False  # needs a version-2 trace

    def prefetch_for(self, layer: int, predicted_counts: np.ndarray | None, capacity: int) -> np.ndarray:
        """Experts of ``layer`` to copy ahead, best first (at most ``capacity``)."""
        raise NotImplementedError

    def on_prefetched(self, layer: int, experts: np.ndarray, clock: int) -> None:
        """The experts that were copied (or already resident and protected) for ``layer``."""


def ranked(scores: np.ndarray, limit: int) -> np.ndarray:
    """Indices of the positive scores, highest first (ties: lower id), at most ``limit``."""
    idx = np.flatnonzero(scores > 0)
    order = np.lexsort((idx, -scores[idx]))
    return idx[order][: max(int(limit), 0)]


@register
class PrefetchPolicy(LRUPolicy, Prefetcher):
    """LRU eviction + prefetch of the experts the next-layer gate predicts (most tokens first)."""

    name = "prefetch"
    uses_predicted_routes = True

    def prefetch_for(self, layer: int, predicted_counts: np.ndarray | None, capacity: int) -> np.ndarray:
        if predicted_counts is None:
            return np.zeros(0, dtype=np.int64)
        return ranked(np.asarray(predicted_counts, dtype=np.float64), capacity)

    def on_prefetched(self, layer: int, experts: np.ndarray, clock: int) -> None:
        # most recently used as of now, below the experts the access itself will use (clock + share)
        self._last[layer][experts] = np.maximum(self._last[layer][experts], float(clock))
