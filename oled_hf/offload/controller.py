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

Deferred accesses: where a layer holds every one of its experts (:meth:`holds_all`) the plan is
all hits whatever the routing, so the live executor runs the layer at once and hands the access
over with ``ctrl.defer(DeferredAccess(...))`` while its routing is still on the way to the host.
The controller plans deferred accesses (the very ``plan(layer, ids, weights)`` calls, in the same
order) before anything that reads or changes policy or planner state: the next ``plan``,
``begin_forward``, the events, ``rebalance``, ``recover`` and ``stats``. A deferred plan changes no
residency (all hits), so decisions, counters and traces are those of planning each access at once.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from oled_hf.modeling.events import IterationEvent, IterationObserver

from .allocation import AdaptiveAllocator, uniform_capacities
from .costmodel import CostModel
from .layer_plan import LayerPlan
from .live_timing import CopyTimer
from .planner import CacheState, SlotMove
from .policies.base import as_numpy
from .stats import CacheStats
from .system import System, build_dispatcher, build_policy, build_prefetcher


@dataclass
class DeferredAccess:
    """A layer access the executor already ran from its slots, to be planned once its routing is on the host."""

    layer: int
    routing: Callable[[], tuple[Any, Any]]  # -> (topk_ids, topk_weights or None) on the host; may wait
    ready: Callable[[], bool] = lambda: True  # whether ``routing()`` would return without waiting


class CacheController(IterationObserver):
    """Planner + policy + dispatcher + allocator for one model instance, built from one system.

    ``system`` gives the retention policy, the dispatch and the allocation: the runtime hands it the
    one ``attach`` resolved (as it hands ``total_slots``); without one, the config's
    (``config.resolved_system()``, for replay and tests). ``config`` is an ``OffloadConfig``, read for
    the budget (only without ``total_slots``/``capacities``) and the knobs; it is not imported here
    (the config imports the runtime, which imports this module).
    Its prefetch part is run here too (:meth:`prefetch`, the one decision live and replay share);
    only when a prefetch is issued, and how many fit into idle copy time (its ``budget``), is the
    caller's. ``believed``: the cost model the dispatcher decides with
    (default ``cost_model``, which is also what the slots are sized with).
    """

    def __init__(
        self,
        config: Any,
        num_layers: int,
        num_experts: int,
        cost_model: CostModel,
        *,
        capacities: list[int] | None = None,
        total_slots: int | None = None,
        system: System | None = None,
        believed: CostModel | None = None,
    ) -> None:
        self.config = config
        self.num_layers = num_layers
        self.num_experts = num_experts
        self.cost_model = cost_model
        # total_slots: resolved by the caller (the live runtime asks the device for cache_ratio="auto")
        self.total_slots = total_slots if total_slots is not None else config.resolve_slots(
            num_layers, num_experts, expert_bytes=cost_model.expert_bytes)
        caps = capacities if capacities is not None else uniform_capacities(self.total_slots, num_layers, num_experts)
        self.state = CacheState(num_layers, num_experts, caps, expert_bytes=cost_model.expert_bytes)
        self.total_slots = self.state.total_slots
        self.system = system if system is not None else config.resolved_system()
        self.policy = build_policy(self.system, num_layers, num_experts, config)
        self.policy.set_capacities(self.state.capacities)
        self.believed = believed if believed is not None else cost_model  # what decisions are made with
        self.dispatcher = build_dispatcher(self.system, self.believed)
        self.prefetcher = build_prefetcher(self.system, num_layers, num_experts)
        self.last_plan: tuple[int, LayerPlan] | None = None  # the latest (layer, plan), kept with a prefetcher
        self.allocator: AdaptiveAllocator | None = None
        if self.system.layer_adaptive:
            self.allocator = AdaptiveAllocator(
                num_layers,
                num_experts,
                self.total_slots,
                min_slots=config.min_slots_per_layer,
                damping=config.rebalance_damping,
            )
        self.clock = 0
        self.last_moves: list[SlotMove] = []
        self._deferred: deque[DeferredAccess] = deque()
        self._run_shadows = getattr(self.policy, "run_shadows", None)  # adaptive's; looked up once, off the hot path
        self.plan_timer: Callable[[int, float], None] | None = None  # (layer, seconds) of each deferred plan
        # live copy intervals not read yet, for the dispatcher's online calibration (every layer's
        # executor loads on the one copy stream; replay hands the dispatcher its times directly)
        self.copy_timer = CopyTimer()

    @property
    def stats(self) -> CacheStats:
        self.flush()
        return self.state.stats

    @property
    def capacities(self) -> list[int]:
        return self.state.capacities

    def begin_forward(self) -> None:
        """Advance the policy clock; call once before the first MoE layer of every forward."""
        self.flush()
        self.clock += 1

    def holds_all(self, layer: int) -> bool:
        """Whether the layer holds every expert, so its next plan is all hits (host state only, no flush).

        Pending deferred accesses do not change the answer: they are all hits, which move no expert.
        """
        return self.state.holds_all(layer)

    def defer(self, access: DeferredAccess) -> None:
        """Queue an access of a layer that :meth:`holds_all`; it is planned on the next :meth:`flush`."""
        self._deferred.append(access)

    def flush(self, wait: bool = True) -> None:
        """Plan the deferred accesses in order; ``wait=False``: only while their routing has landed."""
        pending = self._deferred
        while pending and (wait or pending[0].ready()):
            access = pending.popleft()
            start = time.perf_counter()
            plan = self._plan(access.layer, *access.routing())
            if plan.copies or plan.cpu:  # the executor ran it from the slots: it must have been all hits
                raise RuntimeError(f"deferred access of layer {access.layer} was not all hits")
            if self.plan_timer is not None:
                self.plan_timer(access.layer, time.perf_counter() - start)

    def plan(self, layer: int, topk_ids: Any, topk_weights: Any) -> LayerPlan:
        """Plan one MoE layer access ([T, k] routing); updates policy, residency, stats.

        On the forward's critical path once per MoE layer: the routing is converted to NumPy and
        counted once here, and everything below takes the converted arrays and the counts.
        """
        if self._deferred:
            self.flush()
        return self._plan(layer, topk_ids, topk_weights)

    def _plan(self, layer: int, topk_ids: Any, topk_weights: Any) -> LayerPlan:
        ids = as_numpy(topk_ids)
        weights = as_numpy(topk_weights) if self.policy.uses_weights and topk_weights is not None else topk_weights
        counts = np.bincount(ids.reshape(-1), minlength=self.num_experts)
        self.policy.observe_access(layer, ids, weights, self.clock, counts)
        plan = self.state.plan(layer, ids, weights, self.policy, self.dispatcher, counts)
        if self.prefetcher is not None:
            self.prefetcher.observe_access(layer, counts, self.clock)
            self.last_plan = (layer, plan)
        if self.allocator is not None:
            self.allocator.observe(layer, counts)
        return plan

    def prefetch(self, layer: int, budget: int | None = None,
                 predicted_counts: np.ndarray | None = None) -> list[tuple[int, int, int | None]]:
        """The prefetch part's copies into ``layer`` ahead of its access: ``(expert, slot, evicted)`` rows.

        Called right after the previous layer's plan. ``budget``: how many copies can start on the
        copy engine before ``layer`` plans (a capped prefetcher honours it; the caller measures it
        on its own copy engine, :func:`idle_copy_budget` being the live one). The admitted experts
        are resident from here on (the planner treats them as hits), so the caller must make
        ``layer``'s compute wait for their copies.
        """
        if self.prefetcher is None or not 0 <= layer < self.num_layers:
            return []
        self.flush()
        want = self.prefetcher.prefetch_for(layer, predicted_counts, self.state.capacities[layer],
                                            budget if self.prefetcher.capped else None,
                                            self.state.resident_mask(layer))
        copies = self.state.admit(layer, want, self.policy)
        self.policy.on_admitted(layer, want, self.clock)
        return copies

    def run_shadows(self) -> int:
        """The retention part's deferred work of the last access (``adaptive``'s shadow caches), if any.

        Callers run it once the access's copies and kernels are issued, off the critical path (the
        executor: before the next layer's routing comes to the host);
        left alone it runs at the next plan or event (the same decisions either way). Returns the
        number of shadow plans it ran.
        """
        return self._run_shadows() if self._run_shadows is not None else 0

    def prefetch_next(self, layer: int) -> list[tuple[int, int, int | None]]:
        """Live: the prefetch into ``layer + 1`` right after ``layer``'s plan, its budget :func:`idle_copy_budget`."""
        if self.prefetcher is None or layer + 1 >= self.num_layers:
            return []
        self.flush()
        last = self.last_plan
        budget = idle_copy_budget(self.believed, last[1]) if last is not None and last[0] == layer else 0
        return self.prefetch(layer + 1, budget)

    def recover(self, slot_tags: Any) -> list[tuple[int, int]]:
        """After a failed access: drop residency the slots do not hold (``CacheState.reconcile``)."""
        self.flush()
        return self.state.reconcile(slot_tags)

    # ------------------------------------------------------------------ events
    def on_block_start(self, block_index: int, token_ids: Any) -> None:
        self.flush()
        self.policy.on_block_start(block_index, token_ids)
        if self.prefetcher is not None:
            self.prefetcher.on_block_start(int(block_index))

    def on_iteration(self, event: IterationEvent) -> None:
        self.flush()
        self.policy.on_iteration(event)

    def on_block_end(self, block_index: int, token_ids: Any) -> None:
        self.flush()
        self.policy.on_block_end(block_index, token_ids)
        self.dispatcher.end_block()  # a calibrating dispatcher publishes its belief (replay does the same)
        self.last_moves = self.rebalance()

    def rebalance(self) -> list[SlotMove]:
        """Apply the allocator's proposal, if any; returns the slot moves."""
        self.flush()
        if self.allocator is None:
            return []
        proposal = self.allocator.propose(self.state.capacities)
        if proposal is None or proposal == self.state.capacities:
            return []
        return self.state.set_capacities(proposal, self.policy)


def idle_copy_budget(cost_model: CostModel, plan: LayerPlan) -> int:
    """How many prefetch copies can start before the next layer plans, as the cost model believes.

    The window from this plan to the next layer's plan is this layer's device work (its launch
    plus each hit and copied expert) and the next layer's non-expert part; the copy engine spends
    the first part of it on this plan's demand and reuse copies. A prefetch starting later than the
    window would be overtaken by its own demand copy, so it is not worth issuing. Replay's
    default measures the same window on its timeline instead (``oled_hf.sim.replay``).
    """
    copy_s = cost_model.copy_time()
    if copy_s <= 0:
        return 0
    gpu = [e for e in plan.hits] + [c[0] for c in plan.copies]
    window = cost_model.nonexpert_s_per_layer
    if gpu:
        window += cost_model.gpu_layer_fixed_s + float(cost_model.gpu_times(plan.counts[gpu]).sum())
    busy = (len(plan.copies) + len(plan.background)) * copy_s
    return max(int(np.ceil((window - busy) / copy_s - 1e-9)), 0)


def build_controller(config: Any, system: System, num_layers: int, num_experts: int,
                     cost_model: CostModel, believed: CostModel | None = None) -> CacheController:
    """A controller for ``config``'s budget running ``system`` (its knobs included) instead of the config's.

    Whatever the config names (its ``system`` or the deprecated aliases) is ignored: the system's
    retention knobs win over the config's (``system.build_policy``). ``believed``: the cost model the
    dispatcher decides with (default ``cost_model``).
    """
    return CacheController(config, num_layers, num_experts, cost_model, system=system, believed=believed)
