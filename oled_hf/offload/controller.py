"""CacheController: the one object the live runtime and replay both drive.

It bundles the slot bookkeeping (:class:`CacheState`), the policy, the dispatcher and the
layer-adaptive allocator, and fixes the call order, so "replay of a trace equals what the live
run counted" holds by construction. Per forward::

    ctrl.begin_forward()
    for each MoE layer l (in model order):
        plan = ctrl.plan(l, topk_ids, topk_weights)   # observe -> plan -> allocator stats
        ... execute plan (hits, copies in order, CPU experts) ...
    ctrl.on_iteration(event)     # denoising forwards only, after the decoder committed tokens

and ``ctrl.on_block_start`` / ``ctrl.on_block_end`` around each block (rebalancing happens at
block end; the returned slot moves are in ``ctrl.last_moves``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from oled_hf.modeling.events import IterationEvent, IterationObserver

from .allocation import AdaptiveAllocator, uniform_capacities
from .costmodel import CostModel
from .dispatch import Dispatcher
from .planner import CacheState, LayerPlan, SlotMove
from .policies import make_policy
from .policies.base import as_numpy
from .stats import CacheStats

if TYPE_CHECKING:  # the config builds the runtime (OffloadConfig.attach): no import back
    from .config import OffloadConfig


class CacheController(IterationObserver):
    """Planner + policy + dispatcher + allocator for one model instance."""

    def __init__(
        self,
        config: OffloadConfig,
        num_layers: int,
        num_experts: int,
        cost_model: CostModel,
        *,
        capacities: list[int] | None = None,
    ) -> None:
        self.config = config
        self.num_layers = num_layers
        self.num_experts = num_experts
        self.cost_model = cost_model
        self.total_slots = config.resolve_slots(num_layers, num_experts)
        caps = capacities if capacities is not None else uniform_capacities(self.total_slots, num_layers, num_experts)
        self.state = CacheState(num_layers, num_experts, caps, expert_bytes=cost_model.expert_bytes)
        self.total_slots = self.state.total_slots
        self.policy = make_policy(config.policy, num_layers, num_experts, config)
        self.policy.set_capacities(self.state.capacities)
        self.dispatcher = Dispatcher(cost_model, config.cpu_compute)
        self.allocator: AdaptiveAllocator | None = None
        if config.layer_adaptive:
            self.allocator = AdaptiveAllocator(
                num_layers,
                num_experts,
                self.total_slots,
                min_slots=config.min_slots_per_layer,
                damping=config.rebalance_damping,
            )
        self.clock = 0
        self.last_moves: list[SlotMove] = []

    @property
    def stats(self) -> CacheStats:
        return self.state.stats

    @property
    def capacities(self) -> list[int]:
        return self.state.capacities

    def begin_forward(self) -> None:
        """Advance the policy clock; call once before the first MoE layer of every forward."""
        self.clock += 1

    def plan(self, layer: int, topk_ids: Any, topk_weights: Any) -> LayerPlan:
        """Plan one MoE layer access ([T, k] routing); updates policy, residency, stats.

        On the forward's critical path once per MoE layer: the routing is converted to NumPy and
        counted once here, and everything below takes the converted arrays and the counts.
        """
        ids = as_numpy(topk_ids)
        weights = as_numpy(topk_weights) if self.policy.uses_weights and topk_weights is not None else topk_weights
        counts = np.bincount(ids.reshape(-1), minlength=self.num_experts)
        self.policy.observe_access(layer, ids, weights, self.clock, counts)
        plan = self.state.plan(layer, ids, weights, self.policy, self.dispatcher, counts)
        if self.allocator is not None:
            self.allocator.observe(layer, counts)
        return plan

    def recover(self, slot_tags: Any) -> list[tuple[int, int]]:
        """After a failed access: drop residency the slots do not hold (``CacheState.reconcile``)."""
        return self.state.reconcile(slot_tags)

    # ------------------------------------------------------------------ events
    def on_block_start(self, block_index: int, token_ids: Any) -> None:
        self.policy.on_block_start(block_index, token_ids)

    def on_iteration(self, event: IterationEvent) -> None:
        self.policy.on_iteration(event)

    def on_block_end(self, block_index: int, token_ids: Any) -> None:
        self.policy.on_block_end(block_index, token_ids)
        self.last_moves = self.rebalance()

    def rebalance(self) -> list[SlotMove]:
        """Apply the allocator's proposal, if any; returns the slot moves."""
        if self.allocator is None:
            return []
        proposal = self.allocator.propose(self.state.capacities)
        if proposal is None or proposal == self.state.capacities:
            return []
        return self.state.set_capacities(proposal, self.policy)
