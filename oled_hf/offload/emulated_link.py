"""The emulated device's copy link: a worker thread, its priority queue, its clock and its events.

The worker copies a wave at a time on the link's schedule (``latency + bytes / bandwidth`` a copy,
back-to-back copies at the link's pace) and lands the wave's bytes when its last copy ends; demand
copies go first, and a prefetch wave on the link yields its unstarted copies to a demand copy. Its
events behave as CUDA's for the host (``query`` never blocks, ``synchronize`` does); a failed copy
fails its waiter, a worker that dies fails every waiter and every later copy. The thread holds this
state, never the device (``emulated.py``), so a dropped device ends its thread.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable

import numpy as np

from .backend import DEMAND, Fill


class CopyFailed(RuntimeError):
    """A copy on the emulated link failed, or its worker died: raised to whoever waits for it."""


class CopyJob:
    __slots__ = ("link", "fill", "nbytes", "after", "slot", "wave", "done", "state", "error", "key", "issued",
                 "start", "lands")

    def __init__(self, link: CopyLink, fill: Fill, nbytes: int, after: list[EmulatedEvent], slot: int,
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

    def __init__(self, jobs: list[CopyJob], stamp: np.ndarray | None = None) -> None:
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


class CopyLink:
    """The copy worker's queue, clock and counters; the worker thread holds this, never the device."""

    def __init__(self, bandwidth: float, latency: float, on_close: Callable[[], None] | None = None) -> None:
        self.bandwidth, self.latency, self.on_close = bandwidth, latency, on_close
        self.queue: list[tuple[int, int, CopyJob]] = []
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
        # every wave: how late its bytes landed after its last copy's time on the link (the worker's own lag)
        self.landed_late_s = 0.0
        self.landed_waves = 0

    def copy_seconds(self, nbytes: int) -> float:
        return self.latency + nbytes / self.bandwidth

    def push(self, jobs: list[CopyJob], priority: int) -> None:
        with self.cv:
            if self.dead is not None:
                raise CopyFailed(f"the emulated copy worker died ({self.dead!r}): no copy can be issued")
            if self.closed:
                raise RuntimeError("the emulated device is closed")
            for job in jobs:
                job.key = (priority, next(self.seq))
                heapq.heappush(self.queue, (*job.key, job))
            self.cv.notify()

    def cancel(self, job: CopyJob) -> bool:
        with self.cv:
            if job.state != "queued":
                return False
            job.state = "cancelled"
            self.cancelled += 1
        job.fill = None
        job.done.set()
        return True

    def promote(self, job: CopyJob) -> None:
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
        """Stop taking copies (the queued ones still land); ``on_close`` runs once, at the first close."""
        with self.cv:
            first, self.closed = not self.closed, True
            self.cv.notify()
        if first and self.on_close is not None:
            self.on_close()

    def _pop(self) -> CopyJob | None:
        """The next queued job in priority order (under ``cv``), taken off the queue; None if none."""
        while self.queue:
            prio, seq, job = heapq.heappop(self.queue)
            if job.state == "queued" and job.key == (prio, seq):
                job.state = "running"
                return job
        return None

    def _next_batch(self) -> list[CopyJob] | None:
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

    def _take(self, job: CopyJob) -> bool:
        """Start ``job`` out of its turn (a copy the running one must follow); False if it already started."""
        with self.cv:
            if job.state != "queued":
                return False
            job.state = "running"
            return True

    def _run_batch(self, batch: list[CopyJob]) -> None:
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
        self.landed_waves += 1

    def _land(self, job: CopyJob) -> None:
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

    def _die(self, err: BaseException, running: list[CopyJob]) -> None:
        with self.cv:
            self.dead = err
            jobs = [j for *_, j in self.queue if j.state == "queued"] + [j for j in running if not j.done.is_set()]
            self.queue.clear()
            for job in jobs:
                job.state, job.error = "failed", f"the copy worker died ({err!r})"
        for job in jobs:
            job.fill = None
            job.done.set()
