"""Timeline of one replay: a copy engine, the GPU, the CPU and the host planner, as busy-until times.

Why a timeline and not a per-layer sum: a copy issued early (a prefetch while an earlier layer
computes) can land before its layer starts and cost nothing, a late one is exposed; demand copies
queue behind prefetches on the one copy engine. The four resources carry their busy-until times
across the layers of a forward and across forwards:

* copy engine: FIFO, one expert per ``copy_s`` (bandwidth-limited, demand copies and prefetches alike),
  except that with ``demand_first`` a demand copy overtakes prefetches queued behind the engine's
  current copy (they are rescheduled after it: ``copies(..., low=True)`` marks a prefetch);
* GPU: per layer the non-expert part (attention, router, shared expert), then, once the plan is
  known, the kernel's fixed cost and every GPU expert in the order its weights are ready;
* CPU: CPU-computed misses, one batch per layer access, concurrent with the GPU, from the plan
  onwards; host DRAM is shared with the copy engine, so the part of a batch that overlaps the
  copy engine's busy time runs at the shared rate (``CostModel.cpu_batch_time(shared=True)``),
  progress assumed uniform over the batch;
* host: the planner (policy update + plan + prefetch decision), serial per layer access; the GPU
  waits for it (the plan needs the router's output, and the expert kernels need the plan).

A layer ends when both its GPU and CPU parts are done (their outputs are summed). Pure float
arithmetic, no NumPy per item beyond the sort of ready times.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

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
    demand_first: bool = False  # demand copies overtake queued prefetches
    moved: dict[Any, float] = field(default_factory=dict)  # key -> new landing time of overtaken prefetches
    _low: list[tuple[float, Any]] = field(default_factory=list)  # queued prefetches: (start, key)

    def clone(self) -> Timeline:
        """An independent copy (what ``copy.deepcopy`` gives, ~20x faster): trial schedules branch on it."""
        return dataclasses.replace(self, moved=dict(self.moved), _low=list(self._low))

    def copies(self, n: int, issue_at: float, *, low: bool = False, keys: list[Any] | None = None) -> np.ndarray:
        """Enqueue ``n`` copies at ``issue_at`` (FIFO behind earlier ones); their landing times.

        ``low``: prefetches (``keys`` name them), which a later demand copy may overtake where
        ``demand_first``; the overtaken ones' new landing times are added to :attr:`moved`.
        """
        if n <= 0:
            return np.zeros(0)
        waiting: list[tuple[float, Any]] = []
        if self.demand_first and not low and self._low:
            waiting = self._waiting(issue_at)
            if waiting:
                self.copy_free = waiting[0][0]  # start where the first waiting prefetch would have
        start = max(self.copy_free, issue_at)
        lands = start + self.copy_s * np.arange(1, n + 1)
        self.copy_free = float(lands[-1])
        if not self.demand_first:
            return lands
        if low:
            ks = keys if keys is not None else [None] * n
            self._low = [e for e in self._low if e[0] + self.copy_s > issue_at]  # drop landed ones
            self._low += [(float(t - self.copy_s), k) for t, k in zip(lands, ks)]
        elif waiting:  # the overtaken prefetches follow the demand copies, in their order
            self._low = []
            for _, key in waiting:
                self._low.append((self.copy_free, key))
                self.copy_free += self.copy_s
                if key is not None:
                    self.moved[key] = self.copy_free
        else:
            self._low = []  # a demand copy queued behind the prefetches: FIFO from here on
        return lands

    def _waiting(self, issue_at: float) -> list[tuple[float, Any]]:
        """Queued prefetches not started by ``issue_at``, if they are the queue's tail (else none)."""
        waiting = [e for e in self._low if e[0] >= issue_at]
        if not waiting or abs(waiting[-1][0] + self.copy_s - self.copy_free) > 1e-12:
            return []
        return waiting

    def cpu_batch_end(self, start: float, alone_s: float, shared_s: float) -> float:
        """When a CPU batch started at ``start`` ends: at the shared rate while the copy engine is busy.

        ``alone_s`` / ``shared_s``: the batch's time with the copy engine idle / busy throughout.
        Progress is uniform: during the overlap ``d`` the batch does ``d * alone_s / shared_s``
        of its work.
        """
        d = self.copy_free - start
        if d <= 0 or shared_s <= alone_s:
            return start + alone_s
        rate = alone_s / shared_s
        if d * rate >= alone_s:
            return start + shared_s
        return start + d + (alone_s - d * rate)

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
        cpu_shared_s: float | None = None,
    ) -> LayerTiming:
        """Run the layer's experts: GPU ones in the order their weights are ready, CPU ones concurrently.

        ``ready``/``gpu_s``: per GPU-computed expert, when its weights are on the device (0 for a
        long-resident hit, a landing time for copies and prefetches) and its kernel time.
        ``cpu_s`` / ``cpu_shared_s``: the CPU batch alone / while the copy engine reads host DRAM
        throughout (None: no sharing).
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
            begin = max(self.cpu_free, plan_ready)
            cpu_end = begin + cpu_s if cpu_shared_s is None else self.cpu_batch_end(begin, cpu_s, cpu_shared_s)
            self.cpu_free = cpu_end
        end = max(gpu_end, cpu_end)
        instant = max(g0 + total, cpu_end)
        self.gpu_free = end
        return LayerTiming(start, plan_ready, end, max(end - instant, 0.0))


@dataclass(frozen=True)
class HostTiming:
    """What one host thread pays, beyond compute, on a device whose compute is the host's (the emulated one).

    ``issue_s``: host seconds to issue one copy (the copy is queued; the link does the rest).
    ``wake_s``: how long after a copy lands a host blocked on it goes on (the copy worker's sleep
    overshoots, then the waiting thread wakes): the emulated device measures it
    (``EmulatedDevice.wake_s``).
    """

    issue_s: float = 0.0
    wake_s: float = 0.0


@dataclass
class HostTimeline(Timeline):
    """The timeline of a run on the emulated device: one host thread, and the copy engine beside it.

    There the non-expert part, the planner, the expert compute (the CPU's, synchronous) and every
    wait for a copy run on one thread in program order; only the copy worker runs in parallel. So
    host and "GPU" are one resource here (``host_free`` is ``gpu_free``), work is charged in the
    executor's order (:meth:`issue` copies, then :meth:`compute` each wave of experts once all of
    its copies have landed: one grouped call per wave), and a blocking wait costs ``wake_s`` more.
    The copy engine is :class:`Timeline`'s, with demand copies first (the device's priority queue).
    """

    timing: HostTiming = field(default_factory=HostTiming)
    waits: int = 0  # blocking waits (a wave whose last copy had not landed)

    def host(self, ready_at: float, seconds: float) -> float:
        self.host_free = self.gpu_free = max(self.host_free, ready_at) + seconds
        return self.host_free

    def issue(self, n: int, *, low: bool = False, keys: list[Any] | None = None) -> np.ndarray:
        """Issue ``n`` copies now (the host pays ``issue_s`` each); their landing times."""
        lands = self.copies(n, self.host_free, low=low, keys=keys)
        self.host(self.host_free, n * self.timing.issue_s)
        return lands

    def compute(self, ready: np.ndarray, seconds: float) -> float:
        """Wait for the wave's copies (``ready``: landing times), then compute it; returns the exposed wait."""
        now = self.host_free
        last = float(ready.max()) if ready.size else 0.0
        exposed = 0.0
        if last > now:
            self.waits += 1
            exposed = last + self.timing.wake_s - now
        self.host(now + exposed, seconds)
        return exposed
