"""Block-start memory: retention that knows a block boundary resets most routes.

Why: in block diffusion every block starts with all positions masked, so a block's first iteration
routes like earlier blocks' first iterations, not like the decoded tokens that the previous block's
last iterations and its KV refresh used. Recency (LRU) holds exactly those decoded-token experts
when the boundary comes, and the first iteration of every block misses the most of any position
(the oracle ladder, ``eval/predictor_quality.py``: at 40% LRU hits 61% of first-iteration requests
where the next-iteration oracle hits 67%). Nothing about the boundary is a guess: the decoder
announces it (an iteration event with no masked position left; then ``on_block_start``).

Algorithm, per MoE layer (``StartMemory``, composed into a policy by :class:`PhasePolicy` here and
by the oled retention part):

* state: ``start[e]``, an exponential average over block starts of whether the block's first
  access used expert e (decay ``start_decay``); ``armed``, whether a boundary is coming;
* event: an iteration leaves no masked position in the block -> ``armed`` (the accesses until the
  next block's first one are the KV refresh, and that first access itself);
* access: if it is the first access of a block (after ``on_block_start``): fold its expert set into
  ``start`` and disarm;
* priority: the base policy's, plus ``KEEP_FIRST`` for experts with ``start[e] >= 0.5`` while
  armed, so that evictions made for the refresh spare the experts the next block start will use.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import register
from .lru import LRUPolicy

KEEP_FIRST = 1e12  # above any LRU clock or OLED score: the predicted block-start set outranks the rest
START_DECAY = 0.5


class StartMemory:
    """The block-start state of every MoE layer (module docstring)."""

    def __init__(self, num_layers: int, num_experts: int, start_decay: float = START_DECAY) -> None:
        if not 0.0 <= start_decay < 1.0:
            raise ValueError(f"start_decay={start_decay} must be in [0, 1)")
        self.decay = float(start_decay)
        self.start = np.zeros((num_layers, num_experts))
        self.armed = np.zeros(num_layers, dtype=bool)
        self.first = np.zeros(num_layers, dtype=bool)  # the layer's next access is a block's first
        self.boost = np.zeros((num_layers, num_experts))

    def on_block_start(self) -> None:
        self.first[:] = True

    def on_iteration(self, event: Any) -> None:
        masked, committed = event.masked, event.committed
        remaining = masked & ~committed
        if not bool(remaining.any()):
            self.armed[:] = True

    def on_access(self, layer: int, counts: np.ndarray) -> None:
        if self.first[layer]:
            s = self.start[layer]
            s *= self.decay
            s += (1.0 - self.decay) * (counts > 0)
            self.first[layer] = self.armed[layer] = False

    def bonus(self, layer: int) -> np.ndarray | None:
        """``KEEP_FIRST`` on the predicted block-start set while a boundary is coming, else None."""
        if not self.armed[layer]:
            return None
        np.multiply(self.start[layer] >= 0.5, KEEP_FIRST, out=self.boost[layer])
        return self.boost[layer]


@register
class PhasePolicy(LRUPolicy):
    """LRU with block-start memory: the block-boundary signal alone, for the ladder and the ablation."""

    name = "phase"

    def __init__(self, num_layers: int, num_experts: int, start_decay: float = START_DECAY, **knobs: Any) -> None:
        super().__init__(num_layers, num_experts, **knobs)
        self.memory = StartMemory(self.num_layers, self.num_experts, start_decay)
        self._prio = np.zeros((self.num_layers, self.num_experts))

    def on_block_start(self, block_index: int, token_ids: Any) -> None:
        self.memory.on_block_start()

    def on_iteration(self, event: Any) -> None:
        self.memory.on_iteration(event)

    def _update(self, layer: int, ids: np.ndarray, weights: Any, counts: np.ndarray, clock: int) -> None:
        super()._update(layer, ids, weights, counts, clock)
        self.memory.on_access(layer, counts)

    def priority_array(self, layer: int) -> np.ndarray:
        bonus = self.memory.bonus(layer)
        if bonus is None:
            return self._last[layer]
        np.add(self._last[layer], bonus, out=self._prio[layer])
        return self._prio[layer]
