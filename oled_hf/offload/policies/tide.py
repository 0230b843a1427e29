"""TIDE-style interval refresh: re-select each layer's resident set every tau iterations.

At prefill, at each block's first iteration and every ``interval`` iterations, each layer's
resident set becomes the top-capacity experts by token count in that access (previously selected
experts fill any remaining places). In between, nothing new is admitted: misses run on the CPU
(or, with CPU compute off, stream through the lowest-priority slot).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import CachePolicy, register, top_set


@register
class TidePolicy(CachePolicy):
    """Periodic top-k-by-tokens re-selection (TIDE's ``jump_steps`` = ``interval``)."""

    name = "tide"
    tracks_usage = False

    def __init__(self, num_layers: int, num_experts: int, interval: int = 4, **knobs: Any) -> None:
        super().__init__(num_layers, num_experts, **knobs)
        self.interval = int(interval)
        self._score = np.zeros((self.num_layers, self.num_experts))
        self._selected = np.zeros((self.num_layers, self.num_experts), dtype=bool)
        self._reselect = np.ones(self.num_layers, dtype=bool)  # prefill selects first
        self._ever = np.zeros(self.num_layers, dtype=bool)  # admits everything until a first selection
        self._next_iteration = 0

    @classmethod
    def from_config(cls, num_layers: int, num_experts: int, config: Any) -> TidePolicy:
        return cls(num_layers, num_experts, interval=config.tide_interval)

    def set_capacities(self, capacities: list[int]) -> None:
        super().set_capacities(capacities)
        for l in range(self.num_layers):
            if self._selected[l].any():
                self._selected[l] = top_set(self._score[l], int(capacities[l]))

    def on_block_start(self, block_index: int, token_ids: Any) -> None:
        self._next_iteration = 0
        self._reselect[:] = True

    def on_iteration(self, event: Any) -> None:
        self._next_iteration = int(event.iteration) + 1
        if self._next_iteration % self.interval == 0:
            self._reselect[:] = True

    def _update(self, layer: int, ids: np.ndarray, weights: Any, counts: np.ndarray, clock: int) -> None:
        if not self._reselect[layer]:
            return
        self._reselect[layer] = False
        self._ever[layer] = True
        # token counts now rank; the previous selection breaks ties (and fills unused places)
        self._score[layer] = counts + 0.5 * self._selected[layer]
        cap = self.num_experts if self.capacities is None else int(self.capacities[layer])
        self._selected[layer] = top_set(self._score[layer], cap) & (self._score[layer] > 0)

    def priority_array(self, layer: int) -> np.ndarray:
        return self._score[layer]

    def reuse_array(self, layer: int) -> np.ndarray:
        remaining = self.interval - (self._next_iteration % self.interval)
        return np.where(self._selected[layer], float(remaining), 0.0)

    def reuse_of(self, layer: int, experts: np.ndarray) -> np.ndarray:
        remaining = self.interval - (self._next_iteration % self.interval)
        return np.where(self._selected[layer][experts], float(remaining), 0.0)

    def admission(self, layer: int) -> np.ndarray | None:
        return self._selected[layer] if self._ever[layer] else None
