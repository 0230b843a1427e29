"""The physical bound: the least time any system could take on a trace at a cache budget.

Per trace and budget (``total_slots``), Belady's MIN with bypass over all layers (``global_min``,
which bounds any per-layer split) says which requested experts are hits and which are misses. The
bound then charges, per layer access:

* the misses: each either copied (one ``copy_time`` on the copy engine, then computed on the GPU)
  or computed on the CPU (``cpu_time(n)``, its roofline, no batch overhead); for k copies the k
  misses of largest CPU time go to the copy engine;
* the GPU: the non-expert part (attention, router, shared expert), then the hits and the k copied
  misses as a fused MoE (one launch, each expert's weights once from HBM, the hits' tokens' FLOPs);
* copy engine and CPU work in parallel with each other and with the whole access, the
  non-expert part included (the CPU is usable during non-expert time), so the access takes
  ``min over k of max(GPU_k, k x copy_time, CPU time of the other misses)``.

Assumptions (each makes the bound lower, never higher): the copied misses' FLOPs are free (their
weight reads are not), and a copy's compute overlaps its transfer; no planner time; no CPU batch
overhead and no host-DRAM sharing; routing is known at the access's start. What it does *not*
cover: a miss's copy issued during an earlier layer (a prefetch) overlaps that layer's time, which
this per-access bound does not credit, so a prefetching system could in principle go below it; and
MIN minimises the number of misses, not their cost (a policy missing more but cheaper experts
could beat it; the exact cost-aware bound is a min-cost flow, ``docs/peers.md`` section 4, not
computed here). Accesses are summed: layers run
in sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oled_hf.offload.costmodel import CostModel

from ...offload.trace import Trace
from ..belady import global_min
from ..demand import request_counts, timed_forwards


@dataclass
class BoundResult:
    """The bound over the timed forwards, and the fused-resident time over the same forwards."""

    time_s: float
    full_time_s: float
    misses: int
    hits: int

    @property
    def ratio_to_full(self) -> float:
        """Bound / fused residency (>= 1 where the cache holds less than every expert)."""
        return self.time_s / self.full_time_s if self.full_time_s > 0 else float("nan")


def access_bound_s(hit_tokens: np.ndarray, miss_tokens: np.ndarray, cm: CostModel) -> float:
    """One layer access: ``min over k of max(GPU_k, k * copy_time, CPU rest_k)`` (module docstring).

    Copying the k misses of largest CPU time is optimal for each k: every copy costs the copy
    engine and the GPU the same (a transfer, a weight read), and it removes the most CPU time.
    """
    h = np.asarray(hit_tokens, dtype=np.float64)
    cpu = np.sort(cm.cpu_times(np.asarray(miss_tokens, dtype=np.float64)))[::-1]
    m = cpu.size
    k = np.arange(m + 1)
    rest = np.concatenate((np.cumsum(cpu[::-1])[::-1], [0.0]))  # CPU time left after copying the first k
    n_gpu = h.size + k
    gpu = (cm.nonexpert_s_per_layer + np.where(n_gpu > 0, cm.gpu_launch_s, 0.0) + n_gpu * cm.expert_read_s
           + float(h.sum()) * cm.gpu_s_per_token)
    return float(np.min(np.maximum(np.maximum(gpu, k * cm.copy_time()), rest)))


def bound_from_counts(counts: np.ndarray, hits: np.ndarray, timed: np.ndarray, cm: CostModel) -> BoundResult:
    """The bound over arrays: ``counts`` tokens ``[L, F, E]``, ``hits`` MIN's hits (bool, same shape),
    ``timed`` which forwards count (bool ``[F]``)."""
    L, F, _ = counts.shape
    total = full = 0.0
    n_hits = n_miss = 0
    for t in np.flatnonzero(timed):
        for l in range(L):
            c = counts[l, t]
            h = hits[l, t] & (c > 0)
            m = ~hits[l, t] & (c > 0)
            total += access_bound_s(c[h], c[m], cm)
            full += cm.nonexpert_s_per_layer + cm.fused_layer_time(c)
            n_hits += int(h.sum())
            n_miss += int(m.sum())
    return BoundResult(total, full, n_miss, n_hits)


def physical_bound(trace: Trace, cm: CostModel, total_slots: int, warmup_sequences: int = 0) -> BoundResult:
    """The bound on a trace at ``total_slots`` GPU expert slots (all layers), over the timed forwards."""
    counts = request_counts(trace)
    hits = np.zeros(counts.shape, dtype=bool)
    global_min(counts > 0, total_slots, hit_out=hits)
    return bound_from_counts(counts, hits, timed_forwards(trace, warmup_sequences), cm)
