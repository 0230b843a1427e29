"""ExpertCache: the device slot pool, allocated once, and the copy waves that fill it.

``total_slots`` rows of ``3*I*H`` elements on the model's device: the device never holds more
routed-expert bytes than that. Which expert sits in which slot is the planner's business
(``CacheState``); this class only moves bytes, through a device backend (``device.py``).

On an asynchronous device (CUDA; the emulated device) copies run beside compute, in **waves**: the
copies of one wave go on one stream (demand or prefetch) and complete one event. Ordering, per slot:

* a kernel reading a slot waits for the event of the slot's last copy (:meth:`wait_ready`);
* a copy into a slot waits, on its own stream, for the slot's last access (its previous copy, or the
  kernel event of the reads since, :meth:`mark_used_many` / :meth:`mark_used_range`), unless that
  stream has already waited for it. The record of which streams waited is kept per event, so a
  kernel event waited for by a demand copy is still waited for by the first prefetch copy into any
  slot it read (a single "forget once waited" would be correct on one stream only: the race this
  fixes was a prefetch overwriting a slot that the all-hits kernel of its layer still read);
* an earlier copy into the slot that has not started is cancelled where the device can (the
  emulated one); the new copy inherits what that copy waited for.

On the CPU the same calls copy synchronously. With the memory-mapped store on CUDA, rows are
staged through a ring of pinned buffers (``staging.py``), never copied ``non_blocking`` from
pageable memory.

Each slot carries a tag, ``slot_tags[slot] = (layer, expert)``, written once that expert's copy has
been issued without error (``(-1, -1)`` while it is being issued, after a failure, and after a wait
that saw an asynchronous copy of its wave fail): the ground truth ``CacheState.check_invariants``
and ``CacheState.reconcile`` compare the bookkeeping against.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .backend import DEMAND, PREFETCH, SyncDevice
from .device import make_device
from .store import ExpertStore, split_expert

STAGING_BUFFERS = 8  # pinned staging rows of the memory-mapped store on CUDA (a wave runs this far ahead)


_ORDER = itertools.count(1)
COPY_STREAMS = frozenset((DEMAND, PREFETCH))


@dataclass
class Access:
    """The latest operation on a slot that a copy into it must follow: a copy wave's event or a kernel's."""

    event: Any
    waited: set[int] = field(default_factory=set)  # copy streams (priorities) that have waited for it
    seq: int = field(default_factory=lambda: next(_ORDER))  # issue order: a later kernel over a slot implies this
    stream: int = -1  # the copy stream (priority) of a copy wave; -1: a kernel


class ExpertCache:
    def __init__(self, store: ExpertStore, total_slots: int, device: torch.device,
                 backend: SyncDevice | None = None):
        self.store = store
        self.backend = backend if backend is not None else make_device(device)
        self.device = self.backend.device
        self.total_slots = total_slots
        self.pool = self.backend.allocate(total_slots, store.numel, store.dtype)
        self.cuda = self.backend.cuda
        self.asynchronous = self.backend.asynchronous
        self.copy_stream = getattr(self.backend, "copy_stream", None)
        self.ready: dict[int, Access] = {}  # slot -> its copy wave, until compute waited for it
        self.last: dict[int, Access] = {}  # slot -> its latest copy or read (shared per event)
        self.range_reads: dict[tuple[int, int], Access] = {}  # (lo, hi) -> a kernel that read every slot in it
        self.prior: dict[int, list[Any]] = {}  # slot -> what its queued copy waited for (a cancel passes it on)
        self.copy_seconds = 0.0
        self.bytes_copied = 0
        self.waves = 0
        self.slot_tags = np.full((total_slots, 2), -1, dtype=np.int64)  # (layer, expert) each slot holds
        mapped = getattr(store, "mode", "pinned") == "mmap"  # pageable rows: staged on CUDA
        self.staging = self.backend.staging_ring(STAGING_BUFFERS) if self.cuda and mapped else None

    @property
    def pool_bytes(self) -> int:
        return self.pool.numel() * self.pool.element_size()

    # ---- copies ---------------------------------------------------------------------------------
    def load(self, slot: int, layer: int, expert: int, priority: int = DEMAND) -> None:
        """Copy one expert from the store into ``slot`` (a wave of one)."""
        self.load_wave([slot], layer, [expert], priority)

    def load_wave(self, slots: Sequence[int], layer: int, experts: Sequence[int], priority: int = DEMAND) -> None:
        """Copy ``experts[i]`` of ``layer`` into ``slots[i]`` as one wave (one event); no slot twice.

        ``priority``: ``backend.DEMAND`` or ``backend.PREFETCH`` (a prefetch yields to demand copies).
        """
        if not len(slots):
            return
        start = time.perf_counter()
        slots = [int(s) for s in slots]
        self.slot_tags[slots] = -1  # overwritten from here on: holds no whole expert until issued
        after = self._hazards(slots, priority) if self.asynchronous else []
        fills = [self._fill(slot, layer, int(e)) for slot, e in zip(slots, experts)]
        event = self.backend.copy(slots, fills, self.store.expert_bytes, priority=priority, after=after)
        if self.staging is not None:
            self.staging.release(event)
        if event is not None:
            access = Access(event, {priority}, stream=priority)
            for slot in slots:
                self.ready[slot] = self.last[slot] = access
            if self.backend.can_cancel:
                for slot in slots:
                    self.prior[slot] = after
        self.slot_tags[slots] = np.column_stack([np.full(len(slots), layer), np.asarray(experts, dtype=np.int64)])
        self.waves += 1
        self.copy_seconds += time.perf_counter() - start
        self.bytes_copied += self.store.expert_bytes * len(slots)

    def _hazards(self, slots: list[int], priority: int) -> list[Any]:
        """The events a copy on ``priority``'s stream into ``slots`` must wait for (each once); marks them waited."""
        out: dict[int, Any] = {}
        cover = np.zeros(len(slots), dtype=np.int64)  # the latest kernel over a whole range, per slot (0: none)
        if self.range_reads:
            arr = np.asarray(slots)
            for key, access in list(self.range_reads.items()):
                inside = (arr >= key[0]) & (arr < key[1])
                if not inside.any():
                    continue
                np.maximum(cover, np.where(inside, access.seq, 0), out=cover)
                if priority not in access.waited:
                    access.waited.add(priority)
                    out[id(access.event)] = access.event
                if access.waited >= COPY_STREAMS:  # both copy streams follow it from here on
                    del self.range_reads[key]
        for slot, covered in zip(slots, cover.tolist()):
            access = self.last.get(slot)
            if access is None or priority in access.waited or covered > access.seq:
                continue  # already waited on this stream, or a later kernel over its range (waited) implies it
            if self.ready.get(slot) is access and self.backend.cancel(access.event, slot):
                del self.ready[slot]  # superseded before it started: what it waited for, this copy waits for
                for event in self.prior.pop(slot, ()):
                    out[id(event)] = event
                continue
            access.waited.add(priority)
            out[id(access.event)] = access.event
        return list(out.values())

    def _fill(self, slot: int, layer: int, expert: int):
        dst = self.pool[slot]
        return lambda non_blocking: self._copy(dst, layer, expert, non_blocking)

    def _copy(self, dst: torch.Tensor, layer: int, expert: int, non_blocking: bool) -> None:
        row = self.store.flat(layer, expert)
        if row is not None:
            dst.copy_(row, non_blocking=non_blocking)
            return
        parts = self.store.weights(layer, expert)
        if non_blocking:  # pageable (memory-mapped) rows go through a pinned staging buffer
            dst.copy_(self.staging.stage(parts), non_blocking=True)
            return
        n = self.store.hidden * self.store.inter
        for p, part in enumerate(parts):
            dst[p * n : (p + 1) * n].copy_(part.reshape(-1))

    # ---- reads ----------------------------------------------------------------------------------
    def mark_used(self, slot: int) -> None:
        """Record that compute reading ``slot`` has been queued (a later copy into it waits for it)."""
        self.mark_used_many([slot])

    def mark_used_many(self, slots) -> None:
        """Record that a kernel reading ``slots`` has been queued: one event for all of them."""
        event = self.backend.compute_event(slots)
        if event is not None:
            access = Access(event)
            for slot in slots:
                self.last[int(slot)] = access

    def mark_used_range(self, lo: int, hi: int) -> None:
        """:meth:`mark_used_many` for the slots ``lo..hi-1``: one event, no work per slot."""
        event = self.backend.compute_event(range(lo, hi))
        if event is not None:
            self.range_reads[(lo, hi)] = Access(event)  # a later kernel over the range implies the earlier one

    def wait_ready(self, slots) -> None:
        """Make compute wait for the copies into ``slots`` still in flight (the emulated device: the host)."""
        if not self.ready:
            return
        waves: dict[int, tuple[Access, list[int]]] = {}
        for slot in slots:
            access = self.ready.pop(int(slot), None)
            if access is not None:
                waves.setdefault(access.seq, (access, []))[1].append(int(slot))
        if self.backend.fifo_streams and len(waves) > 1:  # waiting a stream's latest wave waits its earlier ones
            latest = {a.stream: a.seq for a, _ in sorted(waves.values(), key=lambda w: w[0].seq)}
            waves = {seq: w for seq, w in waves.items() if latest[w[0].stream] == seq}
        for access, wave in waves.values():
            try:
                self.backend.compute_wait(access.event)
            except BaseException:
                self.slot_tags[wave] = -1  # the copies of this wave may not have landed: trust none of them
                raise

    def wait_ready_range(self, lo: int, hi: int) -> None:
        """:meth:`wait_ready` for the slots ``lo..hi-1`` (only copies still in flight are looked at)."""
        if self.ready:
            self.wait_ready([slot for slot in self.ready if lo <= slot < hi])

    def pending_events(self, slots: Sequence[int], priority: int = DEMAND) -> list[Any]:
        """What a copy into ``slots`` would wait for, without marking anything (``live_timing``)."""
        out = [a.event for s in slots if (a := self.last.get(int(s))) is not None and priority not in a.waited]
        for (lo, hi), access in self.range_reads.items():
            if priority not in access.waited and any(lo <= s < hi for s in slots):
                out.append(access.event)
        return out

    def layer_views(self, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Slots ``lo..hi-1`` as grouped-GEMM weights: ``gate_up [n, 2I, H]`` and ``down [n, H, I]`` (views).

        A slot row is (gate, up, down) side by side, so gate and up of a slot are one ``[2I, H]``
        block: the pool is its own stacked layout, and cached experts run as one grouped call.
        """
        h, i = self.store.hidden, self.store.inter
        rows = self.pool[lo:hi]
        return rows[:, : 2 * i * h].view(hi - lo, 2 * i, h), rows[:, 2 * i * h :].view(hi - lo, h, i)

    def synchronize(self) -> None:
        """Wait for every copy in flight (before the slots are read outside the executor)."""
        if self.ready:
            self.wait_ready(list(self.ready))

    def weights(self, slot: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Views of a slot's (gate, up, down); compute first waits for its copy."""
        self.wait_ready([slot])
        return split_expert(self.pool[slot], self.store.hidden, self.store.inter)
