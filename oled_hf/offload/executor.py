"""The offloaded experts executor: runs one MoE layer's routed experts from the cache or the CPU.

Per call: ask the controller for a plan (policy + planner + dispatcher), then compute hits from
their slots, each copy right after it lands in its slot, and CPU-assigned misses from the host
store (concurrently with the device work when the device is a GPU). Every expert sees exactly
the token rows the resident executor would give it and uses the same SwiGLU and combine
(``oled_hf.modeling.experts``), so on one device the result is bit-identical to residency.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import torch

from ..modeling.experts import combine_expert_outputs, group_tokens_by_expert, swiglu_expert


class OffloadedExpertsExecutor:
    def __init__(self, runtime, moe_index: int):
        self.runtime = runtime
        self.moe_index = moe_index

    def __call__(self, moe_block, hidden_states, topk_ids, topk_weights):
        rt, layer = self.runtime, self.moe_index
        clock = time.perf_counter
        t0 = clock()
        plan = rt.controller.plan(layer, topk_ids, topk_weights)
        rt.timing["policy"][layer] += clock() - t0
        groups = group_tokens_by_expert(topk_ids)  # the same grouping the resident executor does
        row_of = {e: i for i, e in enumerate(groups.experts)}
        sorted_x = hidden_states[groups.token_index]
        outputs = torch.empty_like(sorted_x)

        cpu_job = None
        if plan.cpu:
            if rt.overlap_cpu:  # the CPU works while the device computes hits and copies
                rows = [groups.rows(row_of[e]) for e in plan.cpu]
                cpu_index = torch.cat([torch.arange(r.start, r.stop) for r in rows]).to(sorted_x.device)
                host_x = sorted_x[cpu_index].to("cpu").split([r.stop - r.start for r in rows])  # one transfer
                cpu_job = rt.cpu_pool().submit(self._cpu_experts, plan.cpu, host_x)
            else:
                t = clock()
                for e in plan.cpu:
                    r = groups.rows(row_of[e])
                    outputs[r] = swiglu_expert(sorted_x[r], *rt.store.weights(layer, e))
                rt.timing["cpu"][layer] += clock() - t

        t, copying = clock(), 0.0
        for e in plan.hits:
            self._device_expert(e, plan.slot_of[e], sorted_x, outputs, groups.rows(row_of[e]))
        for e, slot, _evicted in plan.copies:
            tc = clock()
            rt.cache.load(slot, layer, e)
            copying += clock() - tc
            self._device_expert(e, slot, sorted_x, outputs, groups.rows(row_of[e]))
        if rt.profile and rt.cache.cuda:
            torch.cuda.synchronize(rt.cache.device)
        rt.timing["copy"][layer] += copying
        rt.timing["gpu"][layer] += clock() - t - copying

        if cpu_job is not None:
            t = clock()
            outputs[cpu_index] = torch.cat(cpu_job.result()).to(outputs.device)  # one transfer back
            rt.timing["cpu_wait"][layer] += clock() - t
        return combine_expert_outputs(groups, outputs, topk_weights, hidden_states.dtype)

    def _device_expert(self, expert, slot, sorted_x, outputs, rows) -> None:
        cache = self.runtime.cache
        outputs[rows] = swiglu_expert(sorted_x[rows], *cache.weights(slot))
        cache.mark_used(slot)

    def _cpu_experts(self, experts: list[int], host_x: list[torch.Tensor]) -> list[torch.Tensor]:
        rt = self.runtime
        start = time.perf_counter()
        out = [swiglu_expert(x, *rt.store.weights(self.moe_index, e)) for e, x in zip(experts, host_x)]
        rt.timing["cpu"][self.moe_index] += time.perf_counter() - start
        return out


def make_cpu_pool() -> ThreadPoolExecutor:
    """One worker: CPU experts of a layer run in order, beside the device work of that layer."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="oled-cpu-experts")
