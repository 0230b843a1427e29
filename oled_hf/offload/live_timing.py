"""What the live run measures for the dispatcher's online calibration (issue 36.3).

Replay hands the calibrator the true cost model's times with noise; a live run hands it these.

*CPU*: the wall time of the grouped CPU expert call of an access, measured around that call (in
the CPU pool's worker when the CPU overlaps the device) and returned with its output; the executor
observes it on the main thread once the result is in, so observations follow the order of the
accesses, whichever thread computed them. The time includes whatever the machine does meanwhile
(host-DRAM contention with the copy engine's reads, the main thread's hold on the GIL, another
tenant): that is the point. Replay instead feeds the batch's time alone, so live the CPU scale
absorbs the average DMA contention, which the dispatch knob ``shared_dram`` also charges: with both
on, contention may be counted twice where sharing bites (not at the H200 preset's 200 GB/s; not
measured).

*Copies*: ``ExpertCache.load`` only enqueues a copy on the copy stream, so the host's wall time is
enqueue time, not transfer time. A pair of CUDA events with timing (:func:`record_start` before a
run of loads, :func:`record_end` after it) brackets their transfer on the device. The pair is read
at a later access, and only once its end event has completed (``event.query()``): reading never
blocks the host, so timing adds no synchronisation. An interval in which the copy stream may wait
for compute (a load into a slot whose previous expert a queued, unfinished kernel still reads,
``ExpertCache.pending_events``) would time that compute too: it is not recorded (:func:`copies_may_wait`).
Limits: if the host issues the loads more slowly than the link moves them (experts of a few KB) the
interval measures the host's pace; a pageable (mmap) store's copies are staged by the driver. On a
CPU device (no CUDA) copies are synchronous memcpys beside the CPU compute and are not timed at
all: only the CPU scale is calibrated there.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

MAX_PENDING = 256  # intervals kept unread at most (the oldest is dropped: a stalled stream stops nothing)


@dataclass
class CopyInterval:
    """Copies bracketed by two timing events on the copy stream (anything with ``query``/``elapsed_time``)."""

    start: Any
    end: Any
    copies: int


@dataclass
class CopyTimer:
    """Copy intervals not read yet, oldest first (one copy stream, so they complete in this order)."""

    pending: deque[CopyInterval] = field(default_factory=deque)

    def add(self, interval: CopyInterval) -> None:
        if interval.copies > 0:
            if len(self.pending) >= MAX_PENDING:
                self.pending.popleft()
            self.pending.append(interval)

    def landed_seconds_per_copy(self) -> float | None:
        """The device time per copy of the intervals that have completed, read without blocking.

        Pops the completed intervals, oldest first, stopping at the first whose end event has not
        completed (a later one cannot have: same stream). None when none had.
        """
        total_ms, copies = 0.0, 0
        while self.pending and self.pending[0].end.query():
            iv = self.pending.popleft()
            total_ms += float(iv.start.elapsed_time(iv.end))
            copies += iv.copies
        return total_ms * 1e-3 / copies if copies else None


def copies_may_wait(cache: Any, slots: list[int]) -> bool:
    """Whether loading ``slots`` may make the copy stream wait for compute (events not yet completed)."""
    return any(not event.query() for event in cache.pending_events(slots))


def record_start(api: Any, stream: Any) -> Any:
    """A timing event recorded on ``stream`` before a run of loads (``api``: the CUDA backend's ``TorchCuda``)."""
    event = api.event(timing=True)
    event.record(stream)
    return event


def record_end(api: Any, start: Any, stream: Any, copies: int) -> CopyInterval:
    """The interval from ``start`` to now on ``stream``, holding ``copies`` copies."""
    return CopyInterval(start, record_start(api, stream), copies)
