"""Happens-before of the slot pool's copies and kernel reads across streams, by vector clocks.

Why: the slot pool is written by copies on two copy streams (demand, prefetch) and read by kernels
on the compute stream. CUDA orders work only along a stream, through ``stream.wait_event`` and
through host synchronisation; a missing wait is a race that no CPU run of the real code can show,
because the CPU executes in issue order. This checker replays those CUDA rules on the operations
as they are issued and raises at the first operation the rules do not order:

* a copy into a slot must happen after the slot's previous copy and after every kernel that read
  the slot since (else it may overwrite bytes still being read, or land before an older copy);
* a kernel read of a slot must happen after the slot's last copy (else it reads the old expert).

Model: every stream, and the host, carries a vector clock (one counter per stream). An operation
on a stream ticks its own counter; an event snapshots the clock of its stream when recorded; a
stream that waits an event, or the host that synchronises on one, takes the element-wise maximum.
An operation is issued by the host, so it also follows everything the host knows to be complete.
Operation A happens before B when B's clock has caught up with A's tick on A's stream.

It runs on the emulated device for every copy and read (``emulated.py``), and in the tests on a
recording fake of ``torch.cuda`` (``tests/offload/cuda_fake.py``). Per-slot state lives in NumPy
arrays so that a whole wave or a layer's slot range is checked in a few vector operations.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

HOST = "host"


class OrderViolation(RuntimeError):
    """Two operations on one slot that the streams' waits do not order (a race on a real GPU)."""


def as_slots(slots: Sequence[int] | np.ndarray | range) -> np.ndarray:
    """Slot indices as an int64 array (a ``range`` without materialising a list)."""
    if isinstance(slots, range):
        return np.arange(slots.start, slots.stop, slots.step, dtype=np.int64)
    return np.asarray(slots, dtype=np.int64).reshape(-1)


class StreamOrder:
    """Vector clocks of ``streams`` (plus the host) and the last copy and reads of each of ``slots`` slots."""

    def __init__(self, streams: Sequence[str], slots: int) -> None:
        names = [HOST, *[s for s in streams if s != HOST]]
        self.index = {name: i for i, name in enumerate(names)}
        n = len(names)
        self.clocks = np.zeros((n, n), dtype=np.int64)  # row s: what stream s has seen of every stream
        self.write_stream = np.full(slots, -1, dtype=np.int64)  # stream of each slot's last copy (-1: none)
        self.write_tick = np.zeros(slots, dtype=np.int64)  # ... and its tick on that stream
        self.read_tick = np.zeros((n, slots), dtype=np.int64)  # last read of each slot per stream since the copy
        # each slot's state before its last copy, restored if that copy is cancelled before it runs
        self.undo_stream, self.undo_tick = self.write_stream.copy(), self.write_tick.copy()
        self.undo_reads = self.read_tick.copy()
        self.operations = 0

    def stamp(self, stream: str) -> np.ndarray:
        """An event recorded on ``stream`` now: a copy of its clock."""
        return self.clocks[self.index[stream]].copy()

    def wait(self, stream: str, stamp: np.ndarray) -> None:
        """``stream`` waits for an event (``stamp``); ``HOST``: the host synchronises on it."""
        row = self.clocks[self.index[stream]]
        np.maximum(row, stamp, out=row)

    def _issue(self, stream: str) -> tuple[int, np.ndarray]:
        """Tick ``stream`` for one operation issued by the host now; its index and its clock."""
        s = self.index[stream]
        row = self.clocks[s]
        np.maximum(row, self.clocks[0], out=row)  # issued after everything the host has seen complete
        row[s] += 1
        self.operations += 1
        return s, row

    def write(self, stream: str, slots, what: str = "copy", undoable: bool = False) -> None:
        """A copy into ``slots`` on ``stream``: it must follow each slot's last copy and the reads since.

        ``undoable``: the copy may be cancelled before it runs (:meth:`cancel` restores the slot).
        """
        idx = as_slots(slots)
        s, row = self._issue(stream)
        if idx.size == 0:
            return
        ws = self.write_stream[idx]
        slot = self._unwaited_copy(idx, row)
        if slot is not None:
            raise OrderViolation(f"{what} into slot {slot} on the {stream} stream is not ordered after the "
                                 f"previous copy into it (on the {self._name(int(self.write_stream[slot]))} stream)")
        unread = self.read_tick[:, idx] > row[:, None]
        if unread.any():
            r, j = np.argwhere(unread)[0]
            raise OrderViolation(f"{what} into slot {int(idx[j])} on the {stream} stream may overwrite it while a "
                                 f"kernel on the {self._name(int(r))} stream still reads it (no wait for that kernel)")
        if undoable:
            self.undo_stream[idx], self.undo_tick[idx] = ws, self.write_tick[idx]
            self.undo_reads[:, idx] = self.read_tick[:, idx]
        self.write_stream[idx] = s
        self.write_tick[idx] = row[s]
        self.read_tick[:, idx] = 0

    def cancel(self, slot: int) -> None:
        """A copy into ``slot`` was cancelled before it ran: the slot's last copy and reads are those before it."""
        self.write_stream[slot], self.write_tick[slot] = self.undo_stream[slot], self.undo_tick[slot]
        self.read_tick[:, slot] = self.undo_reads[:, slot]

    def read(self, stream: str, slots, what: str = "kernel") -> None:
        """A kernel on ``stream`` reads ``slots``: it must follow each slot's last copy."""
        idx = as_slots(slots)
        s, row = self._issue(stream)
        if idx.size == 0:
            return
        slot = self._unwaited_copy(idx, row)
        if slot is not None:
            raise OrderViolation(f"{what} on the {stream} stream reads slot {slot} before the copy into it (on the "
                                 f"{self._name(int(self.write_stream[slot]))} stream) was waited for")
        self.read_tick[s, idx] = row[s]

    def _unwaited_copy(self, idx: np.ndarray, row: np.ndarray) -> int | None:
        """The first of ``idx`` whose last copy the clock ``row`` has not caught up with (None: all ordered)."""
        ws = self.write_stream[idx]
        late = (ws >= 0) & (row[np.maximum(ws, 0)] < self.write_tick[idx])
        return int(idx[np.argmax(late)]) if late.any() else None

    def _name(self, index: int) -> str:
        return next(name for name, i in self.index.items() if i == index)
