"""Static frequency placement (kTransformers ``frequency`` / Fiddler popularity profiling).

Profiles routing for a warm-up, then fixes each layer's resident set forever: the top-capacity
experts by token frequency. After warm-up only that set is admitted; other experts run on the CPU
or, with CPU compute off, stream through the slot of the lowest-priority resident expert.

``profile`` (tokens per layer and expert, e.g. ``profile_counts`` of a dev-split trace) replaces the
warm-up: the placement is fixed from the first access, as kTransformers' ``--init-expert-location``
and Fiddler's popularity profiling build it offline.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import MAX_REUSE, CachePolicy, geometric_reuse, register, top_set


@register
class StaticPolicy(CachePolicy):
    """Token-frequency profile over ``warmup_iterations`` denoising iterations, then frozen."""

    name = "static"

    def __init__(self, num_layers: int, num_experts: int, warmup_iterations: int = 8,
                 profile: np.ndarray | None = None, **knobs: Any) -> None:
        super().__init__(num_layers, num_experts, **knobs)
        self.warmup_iterations = int(warmup_iterations)
        self._counts = np.zeros((self.num_layers, self.num_experts))
        self._iterations = 0
        self.frozen = False
        self._admit: np.ndarray | None = None
        if profile is not None:
            prof = np.asarray(profile, dtype=np.float64)
            if prof.shape != self._counts.shape:
                raise ValueError(f"static profile has shape {prof.shape}, expected (layers, experts) = "
                                 f"{self._counts.shape}")
            self._counts[:] = prof
            self.frozen = True

    @classmethod
    def from_config(cls, num_layers: int, num_experts: int, config: Any) -> StaticPolicy:
        return cls(num_layers, num_experts, warmup_iterations=config.static_warmup_iterations)

    def set_capacities(self, capacities: list[int]) -> None:
        super().set_capacities(capacities)
        self._admit = None  # the fixed set is top-capacity: recompute for the new split

    def _update(self, layer: int, ids: np.ndarray, weights: Any, counts: np.ndarray, clock: int) -> None:
        if not self.frozen:
            self._counts[layer] += counts

    def on_iteration(self, event: Any) -> None:
        self._iterations += 1
        if not self.frozen and self._iterations >= self.warmup_iterations:
            self.frozen = True
            self._admit = None

    def _admit_mask(self) -> np.ndarray | None:
        if not self.frozen or self.capacities is None:
            return None
        if self._admit is None:
            self._admit = np.stack(
                [top_set(self._counts[l], int(self.capacities[l])) for l in range(self.num_layers)]
            )
        return self._admit

    def priority_array(self, layer: int) -> np.ndarray:
        return self._counts[layer]

    def reuse_array(self, layer: int) -> np.ndarray:
        admit = self._admit_mask()
        if admit is None:
            return super().reuse_array(layer)
        return np.where(admit[layer], MAX_REUSE, 0.0)  # fixed placement: an admitted expert stays

    def reuse_of(self, layer: int, experts: np.ndarray) -> np.ndarray:
        admit = self._admit_mask()
        if admit is None:
            return geometric_reuse(self._usage[layer][experts])
        return np.where(admit[layer][experts], MAX_REUSE, 0.0)

    def admission(self, layer: int) -> np.ndarray | None:
        admit = self._admit_mask()
        return None if admit is None else admit[layer]
