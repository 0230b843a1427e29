"""The device backend under the slot pool: memory, streams, events and asynchronous copies.

The slot pool (``cache.py``) moves bytes through one small interface, so the same executor runs on
three devices:

* ``SyncDevice``: the CPU as its own device. The pool is host memory, a copy is a memcpy that has
  finished when ``copy`` returns, compute is synchronous: there are no events.
* ``CudaDevice``: the pool in GPU memory; demand copies run on a high-priority side stream, prefetch
  copies on a second, low-priority one; an event per copy and per compute that reads a slot.
* ``EmulatedDevice``: an asynchronous device that runs on any CPU, so that the CUDA
  synchronisation can be tested where there is no GPU. Its memory is a separate pool, counted
  against its own budget (``memory_bytes``); copies run on one copy worker thread that takes
  ``latency_s + bytes / bandwidth`` of real wall-clock time per copy (a link of that bandwidth,
  back to back copies included) and writes the bytes only at the end of that time, so a reader
  that does not wait for a copy reads the slot's previous bytes. Demand copies go first: a queued
  prefetch that has not started yields to every demand copy (a prefetch that has started runs to
  its end, as on a copy engine). Its events behave as CUDA's for the host: ``query`` does not
  block, ``synchronize`` blocks until the copy has landed. Compute is the CPU's and synchronous,
  so ``compute_wait`` blocks the host where CUDA would make a stream wait.

A copy into a slot that an earlier copy still targets supersedes that copy: one that has not
started is cancelled (its bytes would overwrite the newer expert), one in flight is waited for
(``after``). On CUDA both are the stream order plus a cross-stream event wait.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

DEMAND, PREFETCH = 0, 1  # copy priorities: a lower value goes first

# LLaDA2.0-mini's expert (h=2048, i=512, bf16) over PCIe 5.0 x16 at ~50 GB/s effective: ~126 us a copy
MINI_EXPERT_BYTES = 3 * 2048 * 512 * 2
PCIE5_BYTES_PER_S = 50e9
DEFAULT_LATENCY_S = 5e-6


def default_bandwidth(expert_bytes: int) -> float:
    """The emulated link's default bytes/s: an expert of ``expert_bytes`` copies in the time PCIe 5 copies mini's.

    The toy models' experts are a few KB; at PCIe 5's raw bandwidth their copies would cost nothing
    beside this CPU's compute. Scaling the link to the expert size keeps the copy time per expert
    that of the real model (~126 us), so the copy engine is the bottleneck it is on a GPU.
    """
    return PCIE5_BYTES_PER_S * expert_bytes / MINI_EXPERT_BYTES


def check_link(bandwidth: Any, latency: Any) -> None:
    """An emulated link's bandwidth (bytes/s) and latency (s), or the one-line error naming what is allowed."""
    if isinstance(bandwidth, bool) or not isinstance(bandwidth, (int, float)) or not math.isfinite(bandwidth) \
            or bandwidth <= 0:
        raise ValueError(f"emulated bandwidth={bandwidth!r} is invalid: must be a finite number of bytes/s > 0")
    if isinstance(latency, bool) or not isinstance(latency, (int, float)) or not math.isfinite(latency) \
            or not 0 <= latency <= 1:
        raise ValueError(f"emulated latency={latency!r} is invalid: must be a number of seconds in [0, 1]")


class SyncDevice:
    """The CPU as its own device: synchronous copies, no events."""

    name = "cpu"
    asynchronous = False

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)

    def allocate(self, rows: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty((rows, numel), dtype=dtype, device=self.device)

    def copy(self, fill: Callable[[bool], None], nbytes: int, *, priority: int = DEMAND,
             after: list[Any] = ()) -> Any:
        fill(False)
        return None

    def cancel(self, event: Any) -> bool:
        return False

    def compute_event(self) -> Any:
        return None

    def compute_wait(self, event: Any) -> None:
        pass

    def close(self) -> None:
        pass


class CudaDevice(SyncDevice):
    """A CUDA device: demand copies on a high-priority stream, prefetches on a low-priority one."""

    name = "cuda"
    asynchronous = True

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        low, high = torch.cuda.Stream.priority_range()  # (least, greatest): greatest is the lower number
        self.streams = {DEMAND: torch.cuda.Stream(device=self.device, priority=high),
                        PREFETCH: torch.cuda.Stream(device=self.device, priority=low)}
        self.copy_stream = self.streams[DEMAND]  # what copy timing brackets (live_timing)

    def copy(self, fill: Callable[[bool], None], nbytes: int, *, priority: int = DEMAND,
             after: list[Any] = ()) -> Any:
        stream = self.streams[priority]
        for event in after:
            stream.wait_event(event)
        with torch.cuda.stream(stream):
            fill(True)
            event = torch.cuda.Event()
            event.record(stream)
        return event

    def compute_event(self) -> Any:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def compute_wait(self, event: Any) -> None:
        torch.cuda.current_stream(self.device).wait_event(event)


class EmulatedEvent:
    """A copy's completion on the emulated device: ``query`` never blocks, ``synchronize`` does."""

    __slots__ = ("_done", "job")

    def __init__(self, job: _Job | None = None) -> None:
        self._done = threading.Event()
        self.job = job
        if job is None:
            self._done.set()

    def query(self) -> bool:
        return self._done.is_set()

    def synchronize(self) -> None:
        job = self.job
        if job is None or self._done.is_set():
            return
        job.device.promote(job)  # someone needs it now: it no longer yields to demand copies
        self._done.wait()
        if job.state == "done":  # the host blocked: how late it saw the copy land (timer slack, wake-up)
            job.device.saw_late(time.perf_counter() - job.lands)

    def elapsed_time(self, end: EmulatedEvent) -> float:  # live_timing reads only CUDA timing events
        raise RuntimeError("emulated events carry no timing")


class _Job:
    __slots__ = ("device", "fill", "nbytes", "after", "event", "state", "key", "issued", "lands")

    def __init__(self, device: EmulatedDevice, fill, nbytes: int, after: list[Any]) -> None:
        self.device, self.fill, self.nbytes, self.after = device, fill, nbytes, list(after)
        self.event = EmulatedEvent(self)
        self.state = "queued"  # -> "running" -> "done" | "cancelled" | "failed"
        self.key: tuple[int, int] = (0, 0)
        self.issued = time.perf_counter()  # when the host issued it: the link cannot start it earlier
        self.lands = self.issued  # when the link finishes it (set when it starts)


class EmulatedDevice(SyncDevice):
    """An asynchronous device on the CPU: a budgeted memory pool, a timed copy worker, CUDA-like events."""

    name = "emulated"

    def __init__(self, bandwidth: float, latency: float = DEFAULT_LATENCY_S,
                 memory_bytes: int | None = None) -> None:
        super().__init__(torch.device("cpu"))
        check_link(bandwidth, latency)
        if memory_bytes is not None and (isinstance(memory_bytes, bool) or not isinstance(memory_bytes, int)
                                         or memory_bytes <= 0):
            raise ValueError(f"emulated memory={memory_bytes!r} is invalid: must be a number of bytes > 0")
        self.asynchronous = True
        self.bandwidth, self.latency, self.memory_bytes = float(bandwidth), float(latency), memory_bytes
        self.allocated = 0
        self.copies = self.cancelled = 0
        self.failures: list[str] = []
        self.busy_s = 0.0  # link time charged (what the copies took on the emulated link)
        # blocking waits for a landed copy and how late, in all, their hosts saw it land (the
        # worker's sleep overshoots, then the waiting thread wakes): what a replay of a run on
        # this device charges per wait (``oled_hf.sim.timeline.HostTimeline``)
        self.blocking_waits = 0
        self.late_s = 0.0
        self._queue: list[tuple[int, int, _Job]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._closed = False
        self._link_free = 0.0  # perf_counter time at which the link finishes the copy it is on
        self._worker = threading.Thread(target=self._run, name="oled-emulated-copy", daemon=True)
        self._worker.start()

    def allocate(self, rows: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        need = rows * numel * torch.empty((), dtype=dtype).element_size()
        if self.memory_bytes is not None and self.allocated + need > self.memory_bytes:
            raise ValueError(f"the emulated device has {self.memory_bytes - self.allocated} bytes free of "
                             f"{self.memory_bytes}; a pool of {rows} expert slots needs {need}")
        self.allocated += need
        return torch.empty((rows, numel), dtype=dtype)

    def copy_seconds(self, nbytes: int) -> float:
        return self.latency + nbytes / self.bandwidth

    def copy(self, fill: Callable[[bool], None], nbytes: int, *, priority: int = DEMAND,
             after: list[Any] = ()) -> EmulatedEvent:
        job = _Job(self, fill, nbytes, [e for e in after if e is not None])
        with self._cv:
            if self._closed:
                raise RuntimeError("the emulated device is closed")
            job.key = (priority, next(self._seq))
            heapq.heappush(self._queue, (*job.key, job))
            self._cv.notify()
        return job.event

    def cancel(self, event: Any) -> bool:
        """Drop a queued copy that a newer copy into its slot supersedes; False once it has started."""
        job = getattr(event, "job", None)
        with self._cv:
            if job is None or job.state != "queued":
                return False
            job.state = "cancelled"
            self.cancelled += 1
        job.event._done.set()
        return True

    def promote(self, job: _Job) -> None:
        with self._cv:
            if job.state == "queued" and job.key[0] != DEMAND:
                job.key = (DEMAND, job.key[1])
                heapq.heappush(self._queue, (*job.key, job))  # the old entry is skipped by its key
                self._cv.notify()

    def saw_late(self, seconds: float) -> None:
        with self._cv:
            self.blocking_waits += 1
            self.late_s += max(seconds, 0.0)

    @property
    def wake_s(self) -> float:
        """Mean lateness of a blocking wait (0 before any): the copy landed, the host went on this much later."""
        return self.late_s / self.blocking_waits if self.blocking_waits else 0.0

    def compute_event(self) -> Any:
        return None  # compute is synchronous: it has finished when the host goes on

    def compute_wait(self, event: Any) -> None:
        if event is not None:
            event.synchronize()

    def synchronize(self) -> None:
        """Block until every queued copy has landed (or been cancelled)."""
        with self._cv:
            jobs = [j for *_, j in self._queue]
        for job in jobs:
            job.event.synchronize()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()

    def _next(self) -> _Job | None:
        with self._cv:
            while True:
                while self._queue:
                    prio, seq, job = heapq.heappop(self._queue)
                    if job.state == "queued" and job.key == (prio, seq):
                        job.state = "running"
                        return job
                if self._closed:
                    return None
                self._cv.wait()

    def _run(self) -> None:
        while (job := self._next()) is not None:
            start = max(self._link_free, job.issued)
            for event in job.after:  # a copy into a slot waits for the earlier copy into it
                event.synchronize()
                earlier = getattr(event, "job", None)
                if earlier is not None:
                    start = max(start, earlier.lands)
            cost = self.copy_seconds(job.nbytes)
            # The link's own schedule: a copy starts when the link is free, it was issued and the copy
            # it follows has landed, not when this thread woke up. A sleep overshoots by tens of us
            # (the timer's slack); charged to the next copy's start it would accumulate over back to
            # back copies and slow the link below its bandwidth. Overshoot delays only when the host
            # sees a copy land, never the link's pace.
            self._link_free = job.lands = start + cost
            self.busy_s += cost
            wait = self._link_free - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            try:
                job.fill(False)  # the bytes land at the end of the transfer
                job.state = "done"
            except BaseException as err:  # a failed copy completes its event; kept for the host to see
                job.state = "failed"
                self.failures.append(repr(err))
            self.copies += 1
            job.fill = None
            job.event._done.set()


DEVICES = ("cpu", "cuda", "emulated")


def make_device(device: torch.device, emulated: EmulatedDevice | None = None) -> SyncDevice:
    """The backend of a pool on ``device`` (``emulated``: the emulated device, whatever ``device`` is)."""
    if emulated is not None:
        return emulated
    device = torch.device(device)
    return CudaDevice(device) if device.type == "cuda" else SyncDevice(device)
