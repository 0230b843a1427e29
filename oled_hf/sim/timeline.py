"""Timeline of one replay: a copy engine, the GPU, the CPU and the host planner, as busy-until times.

Why a timeline and not a per-layer sum: a copy issued early (a prefetch while an earlier layer
computes) can land before its layer starts and cost nothing, a late one is exposed; demand copies
queue behind prefetches on the one copy engine. The four resources carry their busy-until times
across the layers of a forward and across forwards:

* copy engine: FIFO, one expert per ``copy_s`` (bandwidth-limited, demand copies and prefetches alike);
* GPU: per layer the non-expert part (attention, router, shared expert), then, once the plan is
  known, the kernel's fixed cost and every GPU expert in the order its weights are ready;
* CPU: CPU-computed misses, concurrent with the GPU, from the plan onwards;
* host: the planner (policy update + plan + prefetch decision), serial per layer access; the GPU
  waits for it (the plan needs the router's output, and the expert kernels need the plan).

A layer ends when both its GPU and CPU parts are done (their outputs are summed). Pure float
arithmetic, no NumPy per item beyond the sort of ready times.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class LayerTiming:
    """What one layer access cost on the timeline (seconds, absolute times)."""

    start: float  # GPU starts the layer (non-expert part)
    plan_ready: float  # host finished planning
    end: float  # GPU and CPU parts done
    exposed_copy_s: float  # end minus the end had every copy been instant (>= 0)


@dataclass
class Timeline:
    """Busy-until times of the copy engine, GPU, CPU and host (seconds since the replay began)."""

    copy_s: float  # one expert's host-to-device copy
    copy_free: float = 0.0
    gpu_free: float = 0.0
    cpu_free: float = 0.0
    host_free: float = 0.0

    def copies(self, n: int, issue_at: float) -> np.ndarray:
        """Enqueue ``n`` copies at ``issue_at`` (FIFO behind earlier ones); their landing times."""
        if n <= 0:
            return np.zeros(0)
        start = max(self.copy_free, issue_at)
        lands = start + self.copy_s * np.arange(1, n + 1)
        self.copy_free = float(lands[-1])
        return lands

    def host(self, ready_at: float, seconds: float) -> float:
        """Run ``seconds`` of host work once it is free and its input is ready; returns the end."""
        self.host_free = max(self.host_free, ready_at) + seconds
        return self.host_free

    def begin_layer(self, nonexpert_s: float, planner_s: float) -> tuple[float, float]:
        """Start the next layer on the GPU (non-expert part), then plan it on the host.

        Returns ``(start, plan_ready)``; demand copies are issued at ``plan_ready``.
        """
        start = self.gpu_free
        return start, self.host(start + nonexpert_s, planner_s)

    def end_layer(
        self,
        start: float,
        plan_ready: float,
        gpu_fixed_s: float,
        ready: np.ndarray,
        gpu_s: np.ndarray,
        cpu_s: float,
    ) -> LayerTiming:
        """Run the layer's experts: GPU ones in the order their weights are ready, CPU ones concurrently.

        ``ready``/``gpu_s``: per GPU-computed expert, when its weights are on the device (0 for a
        long-resident hit, a landing time for copies and prefetches) and its kernel time.
        """
        g0 = plan_ready + (gpu_fixed_s if gpu_s.size else 0.0)
        if gpu_s.size:
            order = np.argsort(ready, kind="stable")
            r, g = ready[order], gpu_s[order]
            suffix = np.cumsum(g[::-1])[::-1]
            total = float(suffix[0])
            gpu_end = max(g0 + total, float((np.maximum(r, g0) + suffix).max()))
        else:
            total, gpu_end = 0.0, plan_ready
        cpu_end = plan_ready
        if cpu_s > 0:
            cpu_end = max(self.cpu_free, plan_ready) + cpu_s
            self.cpu_free = cpu_end
        end = max(gpu_end, cpu_end)
        instant = max(g0 + total, cpu_end)
        self.gpu_free = end
        return LayerTiming(start, plan_ready, end, max(end - instant, 0.0))
