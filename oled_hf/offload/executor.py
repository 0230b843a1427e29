"""The offloaded experts executor: runs one MoE layer's routed experts from the cache or the CPU.

Two paths per call.

*All hits* (the layer holds every one of its experts, ``CacheController.holds_all``, and the
device has a grouped GEMM): the plan is known without the routing, so nothing waits for the host.
The experts run as one grouped SwiGLU over the layer's slot range, keyed by a device-side
expert -> slot map (built once, dropped whenever the layer's slots may change). The routing (ids
and gate weights packed into one tensor) is copied to the host asynchronously (pinned buffer and
an event on CUDA; on the CPU the tensors themselves) and handed to the controller as a deferred
access, which plans it later with the same ``plan`` call, in the same order.

*Planned* (everything else): copy the routing to the host once (ids and, if the policy reads
them, gate weights in one transfer: the one host sync of the layer), ask the controller for a plan
(policy + planner + dispatcher), then run

* the hits as one grouped SwiGLU over the slot pool (the pool's rows are (gate, up, down) side
  by side, so a slot range is a stacked ``[n, 2I, H]`` / ``[n, H, I]`` view; slots of other
  layers or idle slots in the range are zero-token groups),
* the copies, after they land, as one more grouped call (on CUDA the copies stream in while the
  hits compute; a request larger than the layer's capacity streams through slots in turn, one
  grouped call per round of distinct slots),
* the CPU-assigned misses as one grouped call on the host over the store's stacked layer buffer
  (concurrently with the device work when the device is a GPU).

With online calibration (dispatch knob ``calibrate=1``, ``online_calibration``) every access hands
the dispatcher what it measured, on the main thread in access order: the grouped CPU call's wall
time and, on CUDA, the per-copy device time of earlier copies bracketed by timing events on the
copy stream and read without blocking (``live_timing``; on a CPU device copies are not timed).
Calibration changes only where later misses are served, never what an expert computes.

Where the device has no grouped GEMM for the dtype, the planned path runs the per-expert loop.
Every expert sees exactly the token rows the resident executor gives it (a stable sort by slot
keeps each expert's pairs in pair order) and the same grouped kernel and combine
(``oled_hf.modeling.experts``), so on one device the result is bit-identical to residency.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from ..modeling.experts import (
    combine_expert_outputs,
    combine_pairs,
    grouped_supported,
    grouped_swiglu,
    sort_pairs,
    swiglu_expert,
)
from . import cpu_experts
from .backend import PREFETCH, Pending
from .controller import DeferredAccess
from .host_io import HostBuffers, host_routing, pack_routing, routing_to_host, unpack_routing
from .layer_plan import LayerPlan
from .live_timing import copies_may_wait, record_end, record_start


@dataclass
class Wave:
    """Experts computed by one grouped call, each from its own slot (no slot twice)."""

    experts: np.ndarray
    slots: np.ndarray
    copies: bool  # the wave's experts are copied in first


def plan_waves(plan: LayerPlan) -> list[Wave]:
    """Hits first, then the copies in plan order, a new wave whenever a copy reuses a slot of the current one."""
    waves = []
    hits, hit_slots = plan.hit_arrays()
    if hits.size:
        waves.append(Wave(hits, hit_slots, False))
    experts, slots = plan.copy_arrays()
    if experts.size:
        if plan.streamed is False or np.unique(slots).size == slots.size:  # the usual case: a slot per copy
            waves.append(Wave(experts, slots, True))
        else:  # the request exceeds the layer's capacity: slots are reused within this access
            start, seen = 0, set()
            for j, s in enumerate(slots.tolist()):
                if s in seen:
                    waves.append(Wave(experts[start:j], slots[start:j], True))
                    start, seen = j, set()
                seen.add(s)
            waves.append(Wave(experts[start:], slots[start:], True))
    return waves


@dataclass
class SlotMap:
    """A layer that holds every expert: its slot range and, on the device, each expert's slot - lo."""

    lo: int
    hi: int
    keys: torch.Tensor  # [num_experts] int64 on the cache's device


class OffloadedExpertsExecutor:
    def __init__(self, runtime, moe_index: int):
        self.runtime = runtime
        self.moe_index = moe_index
        self.slot_map: SlotMap | None = None  # valid while the layer's slots are unchanged (all hits)
        self.buffers = HostBuffers(runtime.cache.backend)  # pinned transfer buffers of this layer (CUDA)
        self._deferred_busy = False  # a deferred access has not read its routing buffer yet

    def __call__(self, moe_block, hidden_states, topk_ids, topk_weights):
        rt = self.runtime
        backend = rt.cache.backend
        outer, backend.layer = backend.layer, self.moe_index  # host syncs from here on are this layer's
        try:
            if (rt.defer_routing and rt.controller.holds_all(self.moe_index)
                    and grouped_supported(hidden_states.device.type, hidden_states.dtype)):
                return self._run_all_hits(hidden_states, topk_ids, topk_weights)
            self.slot_map = None  # this access may move the layer's experts
            return self._run(moe_block, hidden_states, topk_ids, topk_weights)
        except BaseException:
            # The plan recorded its copies before they ran: keep only what the slots really hold,
            # so the next forward neither trusts a failed copy nor loses the tokens it would give.
            rt.recover()
            raise
        finally:
            backend.layer = outer

    # ---- all hits: no host sync --------------------------------------------------------------
    def _run_all_hits(self, hidden_states, topk_ids, topk_weights):
        """Every expert is cached: one grouped call over the layer's slots; the plan comes later.

        The access is queued before the experts run, so it is planned even if they fail (as the
        planned path plans before it computes).
        """
        rt, cache = self.runtime, self.runtime.cache
        start = time.perf_counter()
        rt.controller.defer(self._deferred_access(topk_ids, topk_weights))
        m = self.slot_map or self._build_slot_map()
        pairs = sort_pairs(m.keys[topk_ids.reshape(-1)], m.hi - m.lo, topk_ids.shape[-1])
        gate_up, down = cache.layer_views(m.lo, m.hi)
        waited = self._waited(cache.wait_ready_range, m.lo, m.hi)
        out = grouped_swiglu(hidden_states[pairs.token_index], gate_up, down, pairs.offs)
        cache.mark_used_range(m.lo, m.hi)
        other = self._prefetch_next()
        if rt.profile and cache.asynchronous:
            cache.backend.synchronize()
        rt.timing["gpu"][self.moe_index] += time.perf_counter() - start - waited - other
        rt.controller.flush(wait=False)  # earlier accesses whose routing has landed: plan them now
        if rt.controller.dispatcher.calibrator is not None:  # one observation per access, as replay gives
            rt.controller.dispatcher.observe(rt.controller.copy_timer.landed_seconds_per_copy(), None, None)
        return combine_expert_outputs(pairs, out, topk_weights, hidden_states.dtype)

    def _build_slot_map(self) -> SlotMap:
        slot_of = self.runtime.controller.state.resident(self.moe_index)
        experts = np.fromiter(slot_of.keys(), np.int64, len(slot_of))
        slots = np.fromiter(slot_of.values(), np.int64, len(slot_of))
        lo, hi = int(slots.min()), int(slots.max()) + 1
        keys = np.empty(self.runtime.num_experts, dtype=np.int64)
        keys[experts] = slots - lo
        self.slot_map = SlotMap(lo, hi, self.runtime.cache.backend.upload(keys))
        return self.slot_map

    def _deferred_access(self, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> DeferredAccess:
        """The routing on its way to the host, as the planned path would have read it.

        Read when the controller plans it: without waiting if its transfer has landed (the usual case:
        a later layer's routing or the decoder synchronised since), else with one counted host sync.
        """
        layer, need_w = self.moe_index, self.runtime.controller.policy.uses_weights
        backend = self.runtime.cache.backend
        if not backend.cuda:  # the host holds it already: views, nothing to wait for
            return DeferredAccess(layer, lambda: host_routing(topk_ids, topk_weights, need_w))
        packed = pack_routing(topk_ids, topk_weights)
        # a buffer of its own while an earlier deferred access of this layer has not read its routing
        buffer = None if self._deferred_busy else self.buffers.get("deferred", tuple(packed.shape), packed.dtype)
        pending = backend.download(packed, buffer)
        self._deferred_busy = True
        ids_dtype = np.dtype(str(topk_ids.dtype).removeprefix("torch."))
        k = topk_ids.shape[-1]

        def routing():
            if pending.ready():
                host = backend.finish(pending)
            else:
                outer, backend.layer = backend.layer, layer
                try:
                    host = backend.wait(pending)
                finally:
                    backend.layer = outer
            ids, weights = unpack_routing(host.numpy().copy(), k)
            self._deferred_busy = False
            return (ids, weights) if need_w else (ids.astype(ids_dtype), None)  # the planned path's arrays

        return DeferredAccess(layer, routing, pending.ready)

    # ---- planned -------------------------------------------------------------------------------
    def _run(self, moe_block, hidden_states, topk_ids, topk_weights):
        rt, layer, backend = self.runtime, self.moe_index, self.runtime.cache.backend
        clock = time.perf_counter
        rt.routing_transfers[layer] += 1
        self._shadows()  # the last access's, while the device runs up to this layer's router
        t0 = clock()
        need_w = rt.controller.policy.uses_weights
        host_ids, host_w = routing_to_host(backend, topk_ids, topk_weights, need_w,
                                           self._routing_buffer(topk_ids, need_w))
        t1 = clock()
        rt.controller.flush()  # earlier deferred accesses (their routing landed before this layer's): own timers
        t2 = clock()
        plan = rt.controller.plan(layer, host_ids, host_w)
        waves = plan_waves(plan)
        rt.timing["policy"][layer] += (t1 - t0) + (clock() - t2)
        k = topk_ids.shape[-1]
        grouped = grouped_supported(hidden_states.device.type, hidden_states.dtype)
        flat = topk_ids.reshape(-1)
        per_pair = hidden_states.new_empty(flat.numel(), hidden_states.shape[-1])

        calibrating = rt.controller.dispatcher.calibrator is not None
        t, copying, other = clock(), 0.0, 0.0
        waited = rt.timing["copy_wait"][layer]
        issued = None  # the first copy wave goes before anything waits, unless it refills the hits' slots (streamed)
        first = next((w for w in waves if w.copies), None)
        if first is not None and rt.cache.asynchronous and (
                waves[0].copies or not np.isin(first.slots, waves[0].slots).any()):
            self._load(list(zip(first.experts.tolist(), first.slots.tolist())), calibrating)
            issued = first
        copying += clock() - t
        other += self._prefetch_next()  # behind this layer's demand copies, at low priority

        cpu = None
        if plan.cpu:  # its inputs start for the host now; the CPU works while the device computes
            tc = clock()
            cpu = cpu_experts.start(self, sorted(plan.cpu), plan.counts, host_ids.reshape(-1), hidden_states, k)
            other += clock() - tc
        keys = self._wave_keys(waves, flat) if grouped else None
        for i, wave in enumerate(waves):
            if wave.copies and wave is not issued:
                tc = clock()
                self._load(list(zip(wave.experts.tolist(), wave.slots.tolist())), calibrating)
                copying += clock() - tc
            if grouped:
                self._device_wave(wave, keys[i], plan.counts, hidden_states, per_pair, k)
            else:
                self._device_loop(wave, host_ids.reshape(-1), hidden_states, per_pair, k)
        if rt.profile and rt.cache.asynchronous:
            backend.synchronize()
        if plan.background:  # reuse copies (planner rule 4): for the next access, nothing here reads them
            tc = clock()
            self._load([(e, slot) for e, slot, _ in plan.background], calibrating)
            copying += clock() - tc
        rt.timing["copy"][layer] += copying
        rt.timing["gpu"][layer] += clock() - t - copying - other - (rt.timing["copy_wait"][layer] - waited)

        cpu_s = None
        if cpu is not None:
            cpu_s = cpu_experts.finish(rt, layer, cpu, per_pair)
        if calibrating:  # on the main thread after the CPU result: observations in access order
            rt.controller.dispatcher.observe(rt.controller.copy_timer.landed_seconds_per_copy(),
                                             plan.counts[sorted(plan.cpu)] if cpu_s is not None else None, cpu_s)
        return combine_pairs(per_pair, topk_weights, hidden_states.dtype)

    def _shadows(self) -> None:
        """The retention part's deferred work of the last access (``CacheController.run_shadows``).

        Run before this layer's routing comes to the host: the host would otherwise wait there while
        the device finishes the last layer and runs this one's attention and router.
        """
        start = time.perf_counter()
        if self.runtime.controller.run_shadows():
            self.runtime.timing["shadow"][self.moe_index] += time.perf_counter() - start

    def _prefetch_next(self) -> float:
        """The prefetch part's copies into the next layer (``CacheController.prefetch_next``), at low priority.

        Issued right after this layer's demand copies: they use the copy engine's idle time while
        this layer computes, a demand copy overtakes any that has not started, and the next layer's
        compute waits for those it hits (``ExpertCache.wait_ready``). The decision is charged to the
        policy timer, the copies to the copy timer; returns the seconds spent (for the caller's timer).
        """
        rt = self.runtime
        if rt.controller.prefetcher is None:
            return 0.0
        start = time.perf_counter()
        nxt = self.moe_index + 1
        copies = rt.controller.prefetch_next(self.moe_index)
        decided = time.perf_counter()
        if copies:
            if rt.executors[nxt].slot_map is not None:
                rt.executors[nxt].slot_map = None  # its slots change
            rt.cache.load_wave([slot for _, slot, _ in copies], nxt, [e for e, _, _ in copies], priority=PREFETCH)
            rt.prefetches[nxt] += len(copies)
        end = time.perf_counter()
        rt.timing["policy"][self.moe_index] += decided - start
        rt.timing["copy"][self.moe_index] += end - decided
        return end - start
    def _routing_buffer(self, topk_ids: torch.Tensor, need_weights: bool) -> torch.Tensor | None:
        """The pinned buffer this layer's routing comes to the host through (CUDA; None elsewhere)."""
        if not self.runtime.cache.backend.cuda:
            return None
        if need_weights:  # packed: ids and bit-cast fp32 weights, int32
            return self.buffers.get("routing", (topk_ids.shape[0], 2 * topk_ids.shape[-1]), torch.int32)
        return self.buffers.get("routing", tuple(topk_ids.shape), topk_ids.dtype)

    def _waited(self, wait, *args) -> float:
        """Run ``wait`` (the cache's wait for copies in flight) and charge the time it blocked to ``copy_wait``.

        On CUDA the wait is a stream wait and returns at once; on the emulated device the host
        blocks until the copies land: that is the live copy wait the replay's exposed copy time
        is held to (``oled-moe benchmark --device emulated``).
        """
        start = time.perf_counter()
        wait(*args)
        waited = time.perf_counter() - start
        self.runtime.timing["copy_wait"][self.moe_index] += waited
        return waited

    def _load(self, copies: list[tuple[int, int]], timed: bool) -> None:
        """Load ``(expert, slot)`` pairs of this layer as one wave; ``timed`` (calibrating, CUDA only): bracket
        them with timing events on the copy stream unless it may wait for compute (``live_timing``)."""
        cache = self.runtime.cache
        slots = [slot for _, slot in copies]
        timed = timed and cache.cuda and not copies_may_wait(cache, slots)
        start = record_start(cache.backend.api, cache.copy_stream) if timed else None
        cache.load_wave(slots, self.moe_index, [e for e, _ in copies])
        if start is not None:
            self.runtime.controller.copy_timer.add(record_end(cache.backend.api, start, cache.copy_stream, len(copies)))

    def _wave_keys(self, waves: list[Wave], flat: torch.Tensor) -> list[tuple[int, int, torch.Tensor]]:
        """Per wave: its slot range ``lo, hi`` and each routed pair's group key (slot - lo; hi - lo: not in
        the wave), on the device. The expert -> key tables of all waves go up in one upload."""
        tables, ranges = [], []
        for wave in waves:
            lo, hi = int(wave.slots.min()), int(wave.slots.max()) + 1
            key_of = np.full(self.runtime.num_experts, hi - lo, dtype=np.int64)
            key_of[wave.experts] = wave.slots - lo
            tables.append(key_of)
            ranges.append((lo, hi))
        if not tables:
            return []
        keys = self.runtime.cache.backend.upload(np.stack(tables))
        return [(lo, hi, keys[i][flat]) for i, (lo, hi) in enumerate(ranges)]

    def _device_wave(self, wave: Wave, keyed: tuple[int, int, torch.Tensor], counts: np.ndarray, hidden_states,
                     per_pair, k: int) -> None:
        """One grouped SwiGLU over the slot range the wave touches; groups keyed by slot."""
        cache = self.runtime.cache
        lo, hi, keys = keyed
        pairs = sort_pairs(keys, hi - lo, k)
        n = int(np.add.reduce(counts[wave.experts]))  # rows of this wave (sorted first)
        rows = pairs.order[:n]
        gate_up, down = cache.layer_views(lo, hi)
        self._waited(cache.wait_ready, wave.slots.tolist())
        per_pair[rows] = grouped_swiglu(hidden_states[pairs.token_index[:n]], gate_up, down, pairs.offs)
        cache.mark_used_many(wave.slots.tolist())

    def _device_loop(self, wave: Wave, host_flat: np.ndarray, hidden_states, per_pair, k: int) -> None:
        """Fallback where the device has no grouped GEMM for this dtype: the per-expert loop (one upload a wave)."""
        cache = self.runtime.cache
        experts, slots = wave.experts.tolist(), wave.slots.tolist()
        rows_of = [np.flatnonzero(host_flat == e) for e in experts]
        bounds = np.concatenate(([0], np.cumsum([r.size for r in rows_of]))).tolist()
        rows_all = cache.backend.upload(np.concatenate(rows_of))
        self._waited(cache.wait_ready, slots)
        for slot, a, b in zip(slots, bounds[:-1], bounds[1:]):
            rows = rows_all[a:b]
            per_pair[rows] = swiglu_expert(hidden_states[rows // k], *cache.weights(slot))
        cache.mark_used_many(slots)

    # ---- CPU experts (cpu_experts.py) ---------------------------------------------------------
    def _cpu_experts(self, experts: list[int], pending: Pending, offs: np.ndarray) -> tuple[torch.Tensor, float]:
        """This layer's CPU experts (``cpu_experts.compute``); a method, so a test can make it fail."""
        return cpu_experts.compute(self.runtime, self.moe_index, experts, pending, offs)
