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
from concurrent.futures import ThreadPoolExecutor
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
from .controller import DeferredAccess
from .device import PREFETCH
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


def pack_routing(topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
    """Ids and fp32 gate weights as one int32 ``[T, 2k]`` tensor (weights bit-cast): one transfer."""
    return torch.cat([topk_ids.to(torch.int32), topk_weights.float().view(torch.int32)], dim=-1)


def unpack_routing(packed: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    return packed[:, :k], np.ascontiguousarray(packed[:, k:]).view(np.float32)


def routing_to_host(topk_ids: torch.Tensor, topk_weights: torch.Tensor, need_weights: bool):
    """The routing as NumPy: a view on the CPU, else one device-to-host transfer (weights only if needed)."""
    if topk_ids.is_cpu:
        return topk_ids.numpy(), topk_weights.detach().numpy() if need_weights else None
    if not need_weights:
        return topk_ids.cpu().numpy(), None
    return unpack_routing(pack_routing(topk_ids, topk_weights).cpu().numpy(), topk_ids.shape[-1])


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
        self._pinned: torch.Tensor | None = None  # host buffer of the deferred routing (CUDA)
        self._pinned_busy = False  # a deferred access has not read it yet

    def __call__(self, moe_block, hidden_states, topk_ids, topk_weights):
        rt = self.runtime
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
        self._prefetch_next()
        if rt.profile and cache.cuda:
            torch.cuda.synchronize(cache.device)
        rt.timing["gpu"][self.moe_index] += time.perf_counter() - start - waited
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
        self.slot_map = SlotMap(lo, hi, torch.from_numpy(keys).to(self.runtime.cache.device))
        return self.slot_map

    def _deferred_access(self, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> DeferredAccess:
        """The routing on its way to the host, as the planned path would have read it."""
        layer, need_w = self.moe_index, self.runtime.controller.policy.uses_weights
        if not topk_ids.is_cuda:  # the CPU: a view when planned; another device: one copy then
            return DeferredAccess(layer, lambda: routing_to_host(topk_ids, topk_weights, need_w))
        packed = pack_routing(topk_ids, topk_weights)
        if self._pinned_busy or self._pinned is None or self._pinned.shape[0] < packed.shape[0] \
                or self._pinned.shape[1] != packed.shape[1]:
            self._pinned = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
        buffer = self._pinned
        host = buffer[: packed.shape[0]]
        host.copy_(packed, non_blocking=True)
        landed = torch.cuda.Event()
        landed.record(torch.cuda.current_stream(topk_ids.device))
        self._pinned_busy = True
        ids_dtype = torch.empty(0, dtype=topk_ids.dtype).numpy().dtype
        k = topk_ids.shape[-1]

        def routing():
            landed.synchronize()
            ids, weights = unpack_routing(host.numpy().copy(), k)
            if self._pinned is buffer:
                self._pinned_busy = False
            return (ids, weights) if need_w else (ids.astype(ids_dtype), None)  # the planned path's arrays

        return DeferredAccess(layer, routing, landed.query)

    # ---- planned -------------------------------------------------------------------------------
    def _run(self, moe_block, hidden_states, topk_ids, topk_weights):
        rt, layer = self.runtime, self.moe_index
        clock = time.perf_counter
        rt.routing_transfers[layer] += 1
        self._shadows()  # the last access's, while the device runs up to this layer's router
        t0 = clock()
        host_ids, host_w = routing_to_host(topk_ids, topk_weights, rt.controller.policy.uses_weights)
        plan = rt.controller.plan(layer, host_ids, host_w)
        waves = plan_waves(plan)
        rt.timing["policy"][layer] += clock() - t0
        device, k = hidden_states.device, topk_ids.shape[-1]
        grouped = grouped_supported(device.type, hidden_states.dtype)
        flat = topk_ids.reshape(-1)
        per_pair = hidden_states.new_empty(flat.numel(), hidden_states.shape[-1])

        cpu_job = cpu_pairs = cpu_s = None
        if plan.cpu:
            cpu_experts = sorted(plan.cpu)
            cpu_pairs, host_x, cpu_offs = self._cpu_inputs(cpu_experts, plan.counts, host_ids.reshape(-1),
                                                           hidden_states, k)
            if rt.overlap_cpu:  # the CPU works while the device computes hits and copies
                cpu_job = rt.cpu_pool().submit(self._cpu_experts, cpu_experts, host_x, cpu_offs)
            else:
                out, cpu_s = self._cpu_experts(cpu_experts, host_x, cpu_offs)
                per_pair[cpu_pairs] = out.to(device)

        calibrating = rt.controller.dispatcher.calibrator is not None
        t, copying = clock(), 0.0
        waited = rt.timing["copy_wait"][layer]
        issued = None  # the first copy wave goes before the hits compute unless it refills their slots (streamed)
        first = next((w for w in waves if w.copies), None)
        if first is not None and rt.cache.asynchronous and (
                waves[0].copies or not np.isin(first.slots, waves[0].slots).any()):
            self._load(list(zip(first.experts.tolist(), first.slots.tolist())), calibrating)
            issued = first
        self._prefetch_next()  # behind this layer's demand copies, at low priority
        copying += clock() - t
        for wave in waves:
            if wave.copies and wave is not issued:
                tc = clock()
                self._load(list(zip(wave.experts.tolist(), wave.slots.tolist())), calibrating)
                copying += clock() - tc
            if grouped:
                self._device_wave(wave, flat, plan.counts, hidden_states, per_pair, k)
            else:
                self._device_loop(wave, host_ids.reshape(-1), hidden_states, per_pair, k)
        if rt.profile and rt.cache.cuda:
            torch.cuda.synchronize(rt.cache.device)
        if plan.background:  # reuse copies (planner rule 4): for the next access, nothing here reads them
            tc = clock()
            self._load([(e, slot) for e, slot, _ in plan.background], calibrating)
            copying += clock() - tc
        rt.timing["copy"][layer] += copying
        rt.timing["gpu"][layer] += clock() - t - copying - (rt.timing["copy_wait"][layer] - waited)

        if cpu_job is not None:
            t = clock()
            out, cpu_s = cpu_job.result()
            per_pair[cpu_pairs] = out.to(device)  # one transfer back
            rt.timing["cpu_wait"][layer] += clock() - t
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

    def _prefetch_next(self) -> None:
        """The prefetch part's copies into the next layer (``CacheController.prefetch_next``), at low priority.

        Issued right after this layer's plan and its demand copies: they use the copy engine's idle
        time while this layer computes, a demand copy overtakes any that has not started, and the
        next layer's compute waits for those it hits (``ExpertCache.wait_ready``).
        """
        rt = self.runtime
        if rt.controller.prefetcher is None:
            return
        nxt = self.moe_index + 1
        copies = rt.controller.prefetch_next(self.moe_index)
        if copies:
            if rt.executors[nxt].slot_map is not None:
                rt.executors[nxt].slot_map = None  # its slots change
            for e, slot, _ in copies:
                rt.cache.load(slot, nxt, e, priority=PREFETCH)
            rt.prefetches[nxt] += len(copies)

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
        """Load ``(expert, slot)`` pairs of this layer; ``timed`` (calibrating, CUDA only): bracket them
        with timing events on the copy stream unless it may wait for compute (``live_timing``)."""
        cache = self.runtime.cache
        slots = [slot for _, slot in copies]
        start = record_start(cache.copy_stream) if timed and cache.cuda and not copies_may_wait(cache, slots) else None
        for e, slot in copies:
            cache.load(slot, self.moe_index, e)
        if start is not None:
            self.runtime.controller.copy_timer.add(record_end(start, cache.copy_stream, len(copies)))

    def _device_wave(self, wave: Wave, flat, counts: np.ndarray, hidden_states, per_pair, k: int) -> None:
        """One grouped SwiGLU over the slot range the wave touches; groups keyed by slot."""
        cache = self.runtime.cache
        lo, hi = int(wave.slots.min()), int(wave.slots.max()) + 1
        key_of = np.full(self.runtime.num_experts, hi - lo, dtype=np.int64)  # hi - lo: not in this wave
        key_of[wave.experts] = wave.slots - lo
        keys = torch.from_numpy(key_of).to(flat.device, non_blocking=True)[flat]
        pairs = sort_pairs(keys, hi - lo, k)
        n = int(np.add.reduce(counts[wave.experts]))  # rows of this wave (sorted first)
        rows = pairs.order[:n]
        gate_up, down = cache.layer_views(lo, hi)
        self._waited(cache.wait_ready, wave.slots.tolist())
        per_pair[rows] = grouped_swiglu(hidden_states[pairs.token_index[:n]], gate_up, down, pairs.offs)
        cache.mark_used_many(wave.slots.tolist())

    def _device_loop(self, wave: Wave, host_flat: np.ndarray, hidden_states, per_pair, k: int) -> None:
        """Fallback where the device has no grouped GEMM for this dtype: the per-expert loop."""
        cache = self.runtime.cache
        for e, slot in zip(wave.experts.tolist(), wave.slots.tolist()):
            rows = torch.from_numpy(np.flatnonzero(host_flat == e)).to(hidden_states.device)
            per_pair[rows] = swiglu_expert(hidden_states[rows // k], *cache.weights(slot))
            cache.mark_used(slot)

    def _cpu_inputs(self, experts: list[int], counts: np.ndarray, host_flat: np.ndarray, hidden_states, k: int):
        """The CPU experts' pairs (device index, expert-sorted), their rows on the host (one transfer), offs."""
        on_cpu = np.zeros(self.runtime.num_experts, dtype=bool)
        on_cpu[experts] = True
        pairs = np.flatnonzero(on_cpu[host_flat])
        pairs = pairs[np.argsort(host_flat[pairs], kind="stable")]
        offs = np.cumsum(counts[experts])
        index = torch.from_numpy(pairs).to(hidden_states.device)
        return index, hidden_states[index // k].to("cpu"), offs

    def _cpu_experts(self, experts: list[int], host_x: torch.Tensor, offs: np.ndarray) -> tuple[torch.Tensor, float]:
        """All CPU-assigned experts of the layer: one grouped call over the store's layer buffer.

        Returns the output and the call's wall time (seconds), which a calibrating dispatcher observes.
        """
        rt = self.runtime
        start = time.perf_counter()
        views = rt.store.grouped_views(self.moe_index)
        if views is not None and grouped_supported("cpu", host_x.dtype):
            counts = np.zeros(rt.num_experts, dtype=np.int64)
            counts[experts] = np.diff(offs, prepend=0)
            group_offs = torch.from_numpy(np.cumsum(counts).astype(np.int32))
            out = grouped_swiglu(host_x, views[0], views[1], group_offs)
        else:  # mmap store (separate per-expert views) or no grouped GEMM: the reference loop
            out = torch.empty_like(host_x)
            bounds = np.concatenate(([0], offs)).tolist()
            for e, a, b in zip(experts, bounds[:-1], bounds[1:]):
                out[a:b] = swiglu_expert(host_x[a:b], *rt.store.weights(self.moe_index, e))
        elapsed = time.perf_counter() - start
        rt.timing["cpu"][self.moe_index] += elapsed
        return out, elapsed


def make_cpu_pool() -> ThreadPoolExecutor:
    """One worker: CPU experts of a layer run in order, beside the device work of that layer."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="oled-cpu-experts")
