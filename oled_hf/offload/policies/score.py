"""HybriMoE's cache rule: keep the experts with the highest decayed gate-score sum (``score``).

HybriMoE (arXiv 2504.05897) ranks cached experts by a score built from the router's gate weights
over recent steps ("score EMA" in ``docs/peers.md``): per access, ``s_e <- decay * s_e + sum of
the gate weights routed to e``; evict the lowest. Gate weight, not token count or recency, is
what it ranks by: an expert many tokens route to with small weights ranks below one a few tokens
weight heavily.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import CachePolicy, register


@register
class ScorePolicy(CachePolicy):
    """Priority = exponentially decayed sum of gate weights (HybriMoE's score EMA)."""

    name = "score"
    uses_weights = True

    def __init__(self, num_layers: int, num_experts: int, decay: float = 0.7, **knobs: Any) -> None:
        super().__init__(num_layers, num_experts, **knobs)
        if not 0.0 <= float(decay) < 1.0:
            raise ValueError(f"score decay={decay!r} is invalid: must be a number in [0, 1)")
        self.decay = float(decay)
        self._score = np.zeros((self.num_layers, self.num_experts))

    def _update(self, layer: int, ids: np.ndarray, weights: Any, counts: np.ndarray, clock: int) -> None:
        row = self._score[layer]
        row *= self.decay
        if weights is None:  # no gate weights: every route counts 1 / k
            row += counts / max(ids.shape[1], 1)
        else:
            w = np.asarray(weights, dtype=np.float64).reshape(-1)
            row += np.bincount(ids.reshape(-1), weights=w, minlength=self.num_experts)

    def priority_array(self, layer: int) -> np.ndarray:
        return self._score[layer]
