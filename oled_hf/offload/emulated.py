"""The emulated device: an asynchronous device on any CPU, so the CUDA ordering is exercised without a GPU.

Its memory is a separate pool counted against its own budget (``memory_bytes``). Copies run on one
copy worker thread that takes ``latency_s + bytes / bandwidth`` of real wall-clock time per copy
(a link of that bandwidth, back-to-back copies included) and writes the bytes only at the end of
that time, so a reader that does not wait for a copy reads the slot's previous bytes. Demand
copies go first: a queued prefetch that has not started yields to every demand copy (one that has
started runs to its end, as on a copy engine). A wave of copies completes one event, as on CUDA;
the event behaves as CUDA's for the host: ``query`` does not block, ``synchronize`` blocks until
every copy of the wave has landed. Compute is the CPU's and synchronous, so ``compute_wait``
blocks the host where CUDA would make a stream wait.

It also checks the order CUDA would need (``ordering.StreamOrder``, with the demand, prefetch and
compute streams): a copy into a slot must wait for the kernel event of the last read of that slot
and for the slot's previous copy, and a read must follow the wait for its copy; an operation the
waits do not order raises ``OrderViolation`` where it is issued.

A copy into a slot that an earlier queued copy still targets cancels that copy (its bytes would
overwrite the newer expert). A failed copy fails the call that waits for it, naming the slot; a copy
worker that dies fails every waiting call and every later copy instead of leaving them hanging. The
worker thread holds the link's state, not the device: a dropped device closes its link and its
thread ends (no thread per dropped model).
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .backend import DEMAND, PREFETCH, Fill, SyncDevice
from .ordering import StreamOrder

# LLaDA2.0-mini's expert (h=2048, i=512, bf16) over PCIe 5.0 x16 at ~50 GB/s effective: ~126 us a copy
MINI_EXPERT_BYTES = 3 * 2048 * 512 * 2
PCIE5_BYTES_PER_S = 50e9
DEFAULT_LATENCY_S = 5e-6
MIN_BANDWIDTH = 1e3  # bytes/s: slower is a typo (1e-9 GB/s would take hours per copy)
MAX_COPY_S = 1.0  # one expert's copy on the emulated link takes at most this (else a run takes hours)
STREAMS = {DEMAND: "demand", PREFETCH: "prefetch"}
COMPUTE = "compute"


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
            or bandwidth < MIN_BANDWIDTH:
        finite = isinstance(bandwidth, (int, float)) and math.isfinite(bandwidth)
        gbps = f" ({bandwidth / 1e9:g} GB/s)" if finite else ""
        raise ValueError(f"emulated bandwidth={bandwidth!r} bytes/s{gbps} is invalid: must be a finite number of "
                         f"bytes/s >= {MIN_BANDWIDTH:g} ({MIN_BANDWIDTH / 1e9:g} GB/s)")
    if isinstance(latency, bool) or not isinstance(latency, (int, float)) or not math.isfinite(latency) \
            or not 0 <= latency <= MAX_COPY_S:
        raise ValueError(f"emulated latency={latency!r} is invalid: must be a number of seconds in [0, {MAX_COPY_S:g}]")


class CopyFailed(RuntimeError):
    """A copy on the emulated link failed, or its worker died: raised to whoever waits for it."""


class _Job:
    __slots__ = ("link", "fill", "nbytes", "after", "slot", "wave", "done", "state", "error", "key", "issued",
                 "start", "lands")

    def __init__(self, link: _Link, fill: Fill, nbytes: int, after: list[EmulatedEvent], slot: int,
                 wave: int) -> None:
        self.link, self.fill, self.nbytes, self.after, self.slot, self.wave = link, fill, nbytes, after, slot, wave
        self.done = threading.Event()
        self.state = "queued"  # -> "running" -> "done" | "cancelled" | "failed"
        self.error = ""
        self.key: tuple[int, int] = (0, 0)
        self.issued = time.perf_counter()  # when the host issued it: the link cannot start it earlier
        self.start = self.lands = self.issued  # when the link starts and finishes it (set when it is scheduled)


class EmulatedEvent:
    """A wave of copies (or a kernel, with no copies) on the emulated device; ``stamp``: its order clock."""

    __slots__ = ("jobs", "stamp")

    def __init__(self, jobs: list[_Job], stamp: np.ndarray | None = None) -> None:
        self.jobs, self.stamp = jobs, stamp

    def query(self) -> bool:
        return all(job.done.is_set() for job in self.jobs)

    def synchronize(self) -> None:
        """Block until every copy of the wave has landed; a failed copy or a dead worker raises."""
        if not self.query():
            link = self.jobs[0].link
            for job in self.jobs:
                link.promote(job)  # someone needs it now: it no longer yields to demand copies
            for job in self.jobs:
                job.done.wait()
            last = max(job.lands for job in self.jobs if job.state == "done") if any(
                job.state == "done" for job in self.jobs) else None
            if last is not None:  # the host blocked: how late it saw the wave land (timer slack, wake-up)
                link.saw_late(time.perf_counter() - last)
        for job in self.jobs:
            if job.state == "failed":
                raise CopyFailed(f"the emulated copy into slot {job.slot} failed: {job.error}")

    def elapsed_time(self, end: EmulatedEvent) -> float:  # live_timing reads only CUDA timing events
        raise RuntimeError("emulated events carry no timing")


class _Link:
    """The copy worker's queue, clock and counters; the worker thread holds this, never the device."""

    def __init__(self, bandwidth: float, latency: float) -> None:
        self.bandwidth, self.latency = bandwidth, latency
        self.queue: list[tuple[int, int, _Job]] = []
        self.seq = itertools.count()
        self.cv = threading.Condition()
        self.closed = False
        self.dead: BaseException | None = None
        self.link_free = 0.0  # perf_counter time at which the link finishes the copy it is on
        self.copies = self.cancelled = 0
        self.failures: list[str] = []
        self.busy_s = 0.0  # link time charged (what the copies took on the emulated link)
        # blocking waits for a landed wave and how late, in all, their hosts saw it land (the worker's
        # sleep overshoots, then the waiting thread wakes): what a replay of a run on this device
        # charges per wait (``oled_hf.sim.timeline.HostTimeline``)
        self.blocking_waits = 0
        self.late_s = 0.0
        # every copy: how late its bytes landed after its time on the link (the worker's own lag)
        self.landed_late_s = 0.0

    def copy_seconds(self, nbytes: int) -> float:
        return self.latency + nbytes / self.bandwidth

    def push(self, jobs: list[_Job], priority: int) -> None:
        with self.cv:
            if self.dead is not None:
                raise CopyFailed(f"the emulated copy worker died ({self.dead!r}): no copy can be issued")
            if self.closed:
                raise RuntimeError("the emulated device is closed")
            for job in jobs:
                job.key = (priority, next(self.seq))
                heapq.heappush(self.queue, (*job.key, job))
            self.cv.notify()

    def cancel(self, job: _Job) -> bool:
        with self.cv:
            if job.state != "queued":
                return False
            job.state = "cancelled"
            self.cancelled += 1
        job.fill = None
        job.done.set()
        return True

    def promote(self, job: _Job) -> None:
        with self.cv:
            if job.state == "queued" and job.key[0] != DEMAND:
                job.key = (DEMAND, job.key[1])
                heapq.heappush(self.queue, (*job.key, job))  # the old entry is skipped by its key
                self.cv.notify()

    def saw_late(self, seconds: float) -> None:
        with self.cv:
            self.blocking_waits += 1
            self.late_s += max(seconds, 0.0)

    def close(self) -> None:
        with self.cv:
            self.closed = True
            self.cv.notify()

    def _pop(self) -> _Job | None:
        """The next queued job in priority order (under ``cv``), taken off the queue; None if none."""
        while self.queue:
            prio, seq, job = heapq.heappop(self.queue)
            if job.state == "queued" and job.key == (prio, seq):
                job.state = "running"
                return job
        return None

    def _next_batch(self) -> list[_Job] | None:
        """The next job and the rest of its wave queued right behind it (one wake-up a wave, not one a copy)."""
        with self.cv:
            while (first := self._pop()) is None:
                if self.closed:
                    return None
                self.cv.wait()
            batch = [first]
            while self.queue:
                prio, seq, job = self.queue[0]
                if job.state != "queued" or job.key != (prio, seq):
                    heapq.heappop(self.queue)  # a cancelled job or the old entry of a promoted one
                    continue
                if job.wave != first.wave or prio != first.key[0]:
                    break
                heapq.heappop(self.queue)
                job.state = "running"
                batch.append(job)
            return batch

    def _demand_queued(self) -> bool:
        """Whether a demand copy waits in the queue (under ``cv``): a prefetch batch yields to it."""
        while self.queue:
            prio, seq, job = self.queue[0]
            if job.state == "queued" and job.key == (prio, seq):
                return prio == DEMAND
            heapq.heappop(self.queue)
        return False

    def run(self) -> None:
        """The worker thread: copies in priority order; anything unexpected fails every waiter, loudly."""
        batch = None
        try:
            while (batch := self._next_batch()) is not None:
                self._run_batch(batch)
                batch = None
        except BaseException as err:  # noqa: BLE001 - a dead worker must not leave callers hanging
            self._die(err, batch or [])

    def _take(self, job: _Job) -> bool:
        """Start ``job`` out of its turn (a copy the running one must follow); False if it already started."""
        with self.cv:
            if job.state != "queued":
                return False
            job.state = "running"
            return True

    def _run_batch(self, batch: list[_Job]) -> None:
        """Copy a batch on the link's schedule and land its bytes when its last copy ends.

        The link's own schedule: a copy starts when the link is free, it was issued and the copy it
        follows has landed, not when this thread woke up (a sleep overshoots by tens of us; charged to
        the next copy's start it would accumulate and slow the link below its bandwidth). The thread
        wakes once, at the batch's end, and lands every copy of it: the host waits for whole waves
        (one event each), so landing them one by one would only cost the host the worker's GIL time,
        a copy at a time. A prefetch batch yields to a demand copy that arrives meanwhile: its copies
        that have not started on the link go back to the queue, behind the demand copies.
        """
        for job in batch:  # the earlier copies into its slots first, even if they were queued behind it
            for event in job.after:
                for earlier in event.jobs:
                    if self._take(earlier):
                        self._run_batch([earlier])
        before, link_free = self.link_free, self.link_free
        for job in batch:
            start = max(link_free, job.issued)
            for event in job.after:  # a copy into a slot lands after the earlier copy into it
                for earlier in event.jobs:
                    earlier.done.wait()
                    start = max(start, earlier.lands)
            job.start, job.lands = start, start + self.copy_seconds(job.nbytes)
            link_free = job.lands
        self.link_free = link_free
        yields = batch[0].key[0] != DEMAND
        with self.cv:
            while True:
                now = time.perf_counter()
                if yields and self._demand_queued():
                    kept = [job for job in batch if job.start <= now]  # on the link already: they finish
                    for job in batch[len(kept):]:
                        job.state = "queued"
                        heapq.heappush(self.queue, (*job.key, job))
                    batch, yields = kept, False
                    self.link_free = batch[-1].lands if batch else before
                    if not batch:
                        return
                if now >= batch[-1].lands:
                    break
                self.cv.wait(batch[-1].lands - now)
        for job in batch:
            self._land(job)
        self.landed_late_s += max(time.perf_counter() - batch[-1].lands, 0.0)

    def _land(self, job: _Job) -> None:
        """The job's bytes land (its fill runs); a failure completes it as failed, for its waiter to see."""
        try:
            job.fill(False)
            job.state = "done"
        except Exception as err:  # a failed copy completes its wave; the host that waits for it sees it
            job.state, job.error = "failed", repr(err)
            self.failures.append(repr(err))
        self.copies += 1
        self.busy_s += self.copy_seconds(job.nbytes)
        job.fill = None
        job.done.set()

    def _die(self, err: BaseException, running: list[_Job]) -> None:
        with self.cv:
            self.dead = err
            jobs = [j for *_, j in self.queue if j.state == "queued"] + [j for j in running if not j.done.is_set()]
            self.queue.clear()
            for job in jobs:
                job.state, job.error = "failed", f"the copy worker died ({err!r})"
        for job in jobs:
            job.fill = None
            job.done.set()


class EmulatedDevice(SyncDevice):
    """An asynchronous device on the CPU: a budgeted memory pool, a timed copy worker, CUDA-like events."""

    name = "emulated"
    asynchronous = True
    can_cancel = True

    def __init__(self, bandwidth: float, latency: float = DEFAULT_LATENCY_S,
                 memory_bytes: int | None = None) -> None:
        super().__init__(torch.device("cpu"))
        check_link(bandwidth, latency)
        if memory_bytes is not None and (isinstance(memory_bytes, bool) or not isinstance(memory_bytes, int)
                                         or memory_bytes <= 0):
            raise ValueError(f"emulated memory={memory_bytes!r} is invalid: must be a number of bytes > 0")
        self.bandwidth, self.latency, self.memory_bytes = float(bandwidth), float(latency), memory_bytes
        self.allocated = 0
        self.order: StreamOrder | None = None  # the pool's CUDA ordering, checked as copies and reads are issued
        self.link = _Link(self.bandwidth, self.latency)
        self._waves = itertools.count()
        self._worker = threading.Thread(target=self.link.run, name="oled-emulated-copy", daemon=True)
        self._worker.start()
        weakref.finalize(self, self.link.close)  # a dropped device ends its worker

    # the link's counters, read (and reset) through the device
    copies = property(lambda self: self.link.copies)
    cancelled = property(lambda self: self.link.cancelled)
    failures = property(lambda self: self.link.failures)
    busy_s = property(lambda self: self.link.busy_s)
    blocking_waits = property(lambda self: self.link.blocking_waits)
    late_s = property(lambda self: self.link.late_s)

    @property
    def wake_s(self) -> float:
        """Mean lateness of a blocking wait (0 before any): the copy landed, the host went on this much later."""
        link = self.link
        return link.late_s / link.blocking_waits if link.blocking_waits else 0.0

    def reset_counters(self) -> None:
        """Zero the wait counters (``reset_offload_stats``)."""
        with self.link.cv:
            self.link.blocking_waits, self.link.late_s = 0, 0.0

    def copy_seconds(self, nbytes: int) -> float:
        return self.link.copy_seconds(nbytes)

    def check_copy_time(self, expert_bytes: int) -> None:
        """Refuse a link on which one expert's copy takes longer than ``MAX_COPY_S`` (a run would take hours)."""
        seconds = self.copy_seconds(expert_bytes)
        if seconds > MAX_COPY_S:
            raise ValueError(f"the emulated link would take {seconds:.3g} s to copy one expert of {expert_bytes} bytes "
                             f"at {self.bandwidth / 1e9:g} GB/s; allowed: at most {MAX_COPY_S:g} s per copy (raise "
                             "emulated_bandwidth_gbps or lower emulated_latency_us)")

    def allocate(self, rows: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        row_bytes = numel * torch.empty((), dtype=dtype).element_size()
        need = rows * row_bytes
        self.check_copy_time(row_bytes)
        if self.memory_bytes is not None and self.allocated + need > self.memory_bytes:
            raise ValueError(f"the emulated device has {self.memory_bytes - self.allocated} bytes free of "
                             f"{self.memory_bytes}; a pool of {rows} expert slots needs {need}")
        self.allocated += need
        self.order = StreamOrder([COMPUTE, *STREAMS.values()], rows)  # one pool per device: the cache's
        return torch.empty((rows, numel), dtype=dtype)

    def copy(self, slots: Sequence[int], fills: Sequence[Fill], nbytes: int, *, priority: int = DEMAND,
             after: Sequence[Any] = ()) -> EmulatedEvent:
        stream = STREAMS[priority]
        stamp = None
        if self.order is not None:
            for event in after:
                if event.stamp is not None:
                    self.order.wait(stream, event.stamp)
            self.order.write(stream, slots, undoable=True)
            stamp = self.order.stamp(stream)
        waits = [e for e in after if e.jobs]
        wave = next(self._waves)
        jobs = [_Job(self.link, fill, nbytes, waits, int(slot), wave) for slot, fill in zip(slots, fills)]
        self.link.push(jobs, priority)
        return EmulatedEvent(jobs, stamp)

    def cancel(self, event: Any, slot: int) -> bool:
        """Drop ``slot``'s copy of a wave if it has not started (a newer copy into the slot supersedes it)."""
        for job in getattr(event, "jobs", ()):
            if job.slot == slot:
                if not self.link.cancel(job):
                    return False
                if self.order is not None:
                    self.order.cancel(slot)
                return True
        return False

    def compute_event(self, slots: Any) -> EmulatedEvent:
        """Compute is synchronous: the event is complete; it carries the read's place in the stream order."""
        if self.order is None:
            return EmulatedEvent([])
        self.order.read(COMPUTE, slots)
        return EmulatedEvent([], self.order.stamp(COMPUTE))

    def compute_wait(self, event: Any) -> None:
        if event is None:
            return
        if self.order is not None and event.stamp is not None:
            self.order.wait(COMPUTE, event.stamp)
        event.synchronize()

    def synchronize(self) -> None:
        """Block until every queued copy has landed (or been cancelled)."""
        with self.link.cv:
            jobs = [j for *_, j in self.link.queue]
        if jobs:
            EmulatedEvent(jobs).synchronize()

    def close(self) -> None:
        self.link.close()
