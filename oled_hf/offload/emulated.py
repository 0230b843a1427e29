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

import itertools
import math
import sys
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from .backend import DEMAND, PREFETCH, Fill, SyncDevice
from .emulated_link import CopyFailed, CopyJob, CopyLink, EmulatedEvent  # noqa: F401 (CopyFailed: re-exported)
from .ordering import StreamOrder

# LLaDA2.0-mini's expert (h=2048, i=512, bf16) over PCIe 5.0 x16 at ~50 GB/s effective: ~126 us a copy
MINI_EXPERT_BYTES = 3 * 2048 * 512 * 2
PCIE5_BYTES_PER_S = 50e9
DEFAULT_LATENCY_S = 5e-6
MIN_BANDWIDTH = 1e3  # bytes/s: slower is a typo (1e-9 GB/s would take hours per copy)
MAX_COPY_S = 1.0  # one expert's copy on the emulated link takes at most this (else a run takes hours)
STREAMS = {DEMAND: "demand", PREFETCH: "prefetch"}
COMPUTE = "compute"
# The interpreter's thread switch interval while an emulated device exists (the default is 5 ms): the
# copy worker needs the GIL to land a wave, and while the host runs Python (planning) it waited up to
# the whole interval for it, landing copies late by the host's Python stretches, which no replay sees.
SWITCH_INTERVAL_S = 5e-5


class _SwitchInterval:
    """Lowers ``sys.setswitchinterval`` while at least one emulated device is open; restores it after the last."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open = 0
        self.saved = sys.getswitchinterval()

    def acquire(self) -> None:
        with self.lock:
            if self.open == 0:
                self.saved = sys.getswitchinterval()
                sys.setswitchinterval(min(self.saved, SWITCH_INTERVAL_S))
            self.open += 1

    def release(self) -> None:
        with self.lock:
            self.open -= 1
            if self.open == 0:
                sys.setswitchinterval(self.saved)


SWITCH = _SwitchInterval()


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
        SWITCH.acquire()
        self.link = CopyLink(self.bandwidth, self.latency, on_close=SWITCH.release)
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

    @property
    def land_lag_s(self) -> float:
        """Mean lateness of a wave's landing after its time on the link (the worker's wake-up and GIL wait),
        whether or not anyone waited for it; 0 before any."""
        link = self.link
        return link.landed_late_s / link.landed_waves if link.landed_waves else 0.0

    def reset_counters(self) -> None:
        """Zero the wait counters (``reset_offload_stats``)."""
        with self.link.cv:
            self.link.blocking_waits, self.link.late_s = 0, 0.0
            self.link.landed_late_s, self.link.landed_waves = 0.0, 0

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
        jobs = [CopyJob(self.link, fill, nbytes, waits, int(slot), wave) for slot, fill in zip(slots, fills)]
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
