"""Cooperative CPU-GPU compensation: for each miss, copy it to the GPU or compute it on the CPU.

The CPU computes its experts from the host store while the GPU computes hits and copied experts
(copies stream in on the copy engine). Both run concurrently, so one layer access takes roughly
``max(CPU time, GPU+copy time)``. A copy also pays off later: the expert stays cached for its
predicted reuse. The rule (deterministic, vectorised, ~15 us for 70 misses):

1. Misses the policy does not admit run on the CPU (with CPU compute off, everything is copied).
2. Rank the admitted misses by benefit per GPU-side cost,
   ``cpu_time(n) * (1 + reuse) / (gpu_time(n) + copy_time)``: CPU time saved now and on the
   expected reuses, per unit of GPU-side work. High-reuse and token-heavy experts come first.
3. Copy a prefix of that ranking: the one minimising the *amortised makespan*
   ``max(C_j, G_j)`` where ``C_j`` is the CPU time of the misses left on the CPU and ``G_j`` the
   hits' GPU time plus, per copied expert, ``gpu_time + copy_time / (1 + reuse)`` (a copy's cost is
   spread over the accesses it will serve). Copies beyond ``room`` (slots not holding experts of
   this access) would stream through a slot and be evicted at once: they get no amortisation.
   Ties go to the longer prefix (caching has value the estimate does not see).
"""

from __future__ import annotations

import numpy as np

from .costmodel import CostModel


class Dispatcher:
    """Splits one layer access's misses between copy-to-GPU and compute-on-CPU."""

    def __init__(self, cost_model: CostModel | None, cpu_compute: str = "auto") -> None:
        if cpu_compute not in ("auto", "off"):
            raise ValueError(f"cpu_compute={cpu_compute!r} is unknown; allowed: auto, off")
        if cpu_compute == "auto" and cost_model is None:
            raise ValueError("Dispatcher with cpu_compute='auto' needs a cost model")
        self.cost_model = cost_model
        self.cpu_compute = cpu_compute

    @property
    def cpu_enabled(self) -> bool:
        return self.cpu_compute != "off"

    def decide(
        self,
        tokens: np.ndarray,
        reuse: np.ndarray,
        admitted: np.ndarray | None,
        room: int,
        hit_tokens: np.ndarray,
    ) -> np.ndarray:
        """Bool mask over the misses: True = copy to the GPU, False = compute on the CPU.

        ``tokens``: tokens routed to each miss; ``reuse``: the policy's predicted further uses;
        ``admitted``: per-miss admission (None = all); ``room``: copies that can stay cached;
        ``hit_tokens``: tokens of each hit (the GPU's work that is already decided).
        """
        m = len(tokens)
        if not self.cpu_enabled:
            return np.ones(m, dtype=bool)
        copy_mask = np.zeros(m, dtype=bool)
        if m == 0:
            return copy_mask
        cm = self.cost_model
        assert cm is not None
        copy_t = cm.copy_time()
        n = np.asarray(tokens, dtype=np.float64)  # every miss has >= 1 token
        cpu = cm.cpu_overhead_s + np.maximum(cm.cpu_expert_fixed_s, n * cm.cpu_s_per_token)
        gpu = cm.gpu_expert_fixed_s + n * cm.gpu_s_per_token
        r1 = 1.0 + np.maximum(np.asarray(reuse, dtype=np.float64), 0.0)
        key = cpu * r1 / (gpu + copy_t)
        n_cand = m
        if admitted is not None:
            key[~admitted] = -np.inf
            n_cand = int(np.count_nonzero(admitted))
            if n_cand == 0:
                return copy_mask
        order = np.argsort(-key, kind="stable")[:n_cand]
        amort = copy_t / r1[order]
        if room < n_cand:
            amort[max(room, 0):] = copy_t
        g0 = cm.gpu_expert_fixed_s * len(hit_tokens) + cm.gpu_s_per_token * float(np.sum(hit_tokens))
        c0 = float(cpu.sum())
        span = np.maximum(g0 + np.cumsum(gpu[order] + amort), c0 - np.cumsum(cpu[order]))
        # prefix length j in 0..n_cand minimising the span; ties -> the longer prefix
        j = n_cand - int(np.argmin(span[::-1]))
        if span[j - 1] > max(g0, c0):
            j = 0
        copy_mask[order[:j]] = True
        return copy_mask
