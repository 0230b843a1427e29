"""The CPU experts of one layer access: inputs to the host without a wait, one grouped call, the output back.

Started right after the layer's first copy wave: the pairs' token rows are gathered on the device and
start for the host (a pinned buffer and an event); the CPU pool's worker waits for them (the layer's
second and last host sync) and computes every CPU-assigned expert as one grouped call over the store's
layer buffer, while the main thread issues the device's waves. The output goes back through the
backend's pinned upload ring (``non_blocking``, ordered by an event). On a CPU device the same steps
run inline, with views instead of transfers.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from ..modeling.experts import grouped_supported, grouped_swiglu, swiglu_expert
from .backend import Pending


@dataclass
class CpuWork:
    """A layer's CPU experts under way: the pairs they fill (device index), the pool's job or the inline result."""

    index: torch.Tensor
    job: Future | None
    result: tuple[torch.Tensor, float] | None = None


def start(executor, experts: list[int], counts: np.ndarray, host_flat: np.ndarray, hidden_states,
          k: int) -> CpuWork:
    """Start ``executor``'s layer's CPU experts (``executor._cpu_experts`` computes them, in the pool or inline)."""
    rt, backend = executor.runtime, executor.runtime.cache.backend
    on_cpu = np.zeros(rt.num_experts, dtype=bool)
    on_cpu[experts] = True
    pairs = np.flatnonzero(on_cpu[host_flat])
    pairs = pairs[np.argsort(host_flat[pairs], kind="stable")]
    offs = np.cumsum(counts[experts])
    index = backend.upload(pairs)
    x = hidden_states[index // k]
    buffer = executor.buffers.get("cpu_x", tuple(x.shape), x.dtype) if backend.cuda else None
    pending = backend.download(x, buffer)
    if rt.overlap_cpu:  # the CPU works while the device computes hits and copies
        return CpuWork(index, rt.cpu_pool().submit(executor._cpu_experts, experts, pending, offs))
    return CpuWork(index, None, executor._cpu_experts(experts, pending, offs))


def finish(rt, layer: int, work: CpuWork, per_pair: torch.Tensor) -> float:
    """The CPU experts' output into ``per_pair`` (one upload, no wait); returns their compute seconds."""
    if work.job is not None:
        t = time.perf_counter()
        work.result = work.job.result()
        rt.timing["cpu_wait"][layer] += time.perf_counter() - t
    out, cpu_s = work.result
    per_pair[work.index] = rt.cache.backend.upload(out)
    return cpu_s


def compute(rt, layer: int, experts: list[int], pending: Pending, offs: np.ndarray) -> tuple[torch.Tensor, float]:
    """All CPU-assigned experts of the layer: one grouped call over the store's layer buffer.

    Waits for the inputs' transfer first (a counted host sync). Returns the output and the call's
    wall time (seconds, the wait excluded), which a calibrating dispatcher observes.
    """
    host_x = rt.cache.backend.wait(pending)
    start_s = time.perf_counter()
    views = rt.store.grouped_views(layer)
    if views is not None and grouped_supported("cpu", host_x.dtype):
        counts = np.zeros(rt.num_experts, dtype=np.int64)
        counts[experts] = np.diff(offs, prepend=0)
        group_offs = torch.from_numpy(np.cumsum(counts).astype(np.int32))
        out = grouped_swiglu(host_x, views[0], views[1], group_offs)
    else:  # mmap store (separate per-expert views) or no grouped GEMM: the reference loop
        out = torch.empty_like(host_x)
        bounds = np.concatenate(([0], offs)).tolist()
        for e, a, b in zip(experts, bounds[:-1], bounds[1:]):
            out[a:b] = swiglu_expert(host_x[a:b], *rt.store.weights(layer, e))
    elapsed = time.perf_counter() - start_s
    rt.timing["cpu"][layer] += elapsed
    return out, elapsed


def make_cpu_pool() -> ThreadPoolExecutor:
    """One worker: CPU experts of a layer run in order, beside the device work of that layer."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="oled-cpu-experts")
