"""ExpertCache: the device slot pool, allocated once, and the copies that fill it.

``total_slots`` rows of ``3*I*H`` elements on the model's device: the device never holds more
routed-expert bytes than that. Which expert sits in which slot is the planner's business
(``CacheState``); this class only moves bytes, through a device backend (``device.py``). On an
asynchronous device (CUDA; the emulated device) copies run beside compute and each slot carries
an event, so compute waits for exactly the copy it needs while other copies and compute overlap;
a copy into a slot waits for the compute still reading it and supersedes an earlier copy into it
(cancelled if it has not started, else waited for). Prefetch copies go at low priority. On the CPU
the same calls copy synchronously.

Each slot carries a tag, ``slot_tags[slot] = (layer, expert)``, written only once that expert's
copy has been issued without error (``(-1, -1)`` while a copy is in flight or after one failed):
the ground truth ``CacheState.check_invariants`` and ``CacheState.reconcile`` compare the
bookkeeping against.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from .device import DEMAND, SyncDevice, make_device
from .store import ExpertStore, split_expert


class ExpertCache:
    def __init__(self, store: ExpertStore, total_slots: int, device: torch.device,
                 backend: SyncDevice | None = None):
        self.store = store
        self.backend = backend if backend is not None else make_device(device)
        self.device = self.backend.device
        self.total_slots = total_slots
        self.pool = self.backend.allocate(total_slots, store.numel, store.dtype)
        self.cuda = self.backend.name == "cuda"
        self.asynchronous = self.backend.asynchronous
        self.copy_stream = getattr(self.backend, "copy_stream", None)
        self.ready: dict[int, object] = {}  # slot -> its copy has landed (an event)
        self.in_use: dict[int, object] = {}  # slot -> compute reading it has finished
        self.in_use_ranges: dict[tuple[int, int], object] = {}  # (lo, hi) -> ditto, for a slot range
        self.copy_seconds = 0.0
        self.bytes_copied = 0
        self.slot_tags = np.full((total_slots, 2), -1, dtype=np.int64)  # (layer, expert) each slot holds

    @property
    def pool_bytes(self) -> int:
        return self.pool.numel() * self.pool.element_size()

    def load(self, slot: int, layer: int, expert: int, priority: int = DEMAND) -> None:
        """Copy an expert from the store into ``slot``; asynchronous on an asynchronous device.

        ``priority``: ``device.DEMAND`` or ``device.PREFETCH`` (a prefetch yields to demand copies).
        """
        start = time.perf_counter()
        dst = self.pool[slot]
        self.slot_tags[slot] = -1  # overwritten from here on: holds no whole expert until the copy is done
        after = []
        if self.asynchronous:
            earlier = self.ready.pop(slot, None)  # a copy into this slot nobody has waited for yet
            if earlier is not None and not self.backend.cancel(earlier):
                after.append(earlier)  # in flight: this one lands after it
            # Compute queued earlier may still read this slot's previous expert: wait for it only.
            if slot in self.in_use:
                after.append(self.in_use.pop(slot))
            for lo, hi in [r for r in self.in_use_ranges if r[0] <= slot < r[1]]:
                # once waited for, later copies queue behind it: forget it
                after.append(self.in_use_ranges.pop((lo, hi)))
        event = self.backend.copy(lambda non_blocking: self._copy(dst, layer, expert, non_blocking),
                                  self.store.expert_bytes, priority=priority, after=after)
        if event is not None:
            self.ready[slot] = event
        self.slot_tags[slot] = (layer, expert)
        self.copy_seconds += time.perf_counter() - start
        self.bytes_copied += self.store.expert_bytes

    def _copy(self, dst: torch.Tensor, layer: int, expert: int, non_blocking: bool) -> None:
        row = self.store.flat(layer, expert)
        if row is not None:
            dst.copy_(row, non_blocking=non_blocking)
            return
        n = self.store.hidden * self.store.inter
        for p, part in enumerate(self.store.weights(layer, expert)):
            dst[p * n : (p + 1) * n].copy_(part.reshape(-1), non_blocking=non_blocking)

    def mark_used(self, slot: int) -> None:
        """Record that compute reading ``slot`` has been queued (a later copy into it waits for it)."""
        event = self.backend.compute_event()
        if event is not None:
            self.in_use[slot] = event

    def layer_views(self, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Slots ``lo..hi-1`` as grouped-GEMM weights: ``gate_up [n, 2I, H]`` and ``down [n, H, I]`` (views).

        A slot row is (gate, up, down) side by side, so gate and up of a slot are one ``[2I, H]``
        block: the pool is its own stacked layout, and cached experts run as one grouped call.
        """
        h, i = self.store.hidden, self.store.inter
        rows = self.pool[lo:hi]
        return rows[:, : 2 * i * h].view(hi - lo, 2 * i, h), rows[:, 2 * i * h :].view(hi - lo, h, i)

    def wait_ready(self, slots) -> None:
        """Make compute wait for the copies into ``slots`` still in flight (the emulated device: the host)."""
        if self.ready:
            for slot in slots:
                event = self.ready.pop(int(slot), None)
                if event is not None:
                    self.backend.compute_wait(event)

    def wait_ready_range(self, lo: int, hi: int) -> None:
        """:meth:`wait_ready` for the slots ``lo..hi-1`` (only copies still in flight are looked at)."""
        if self.ready:
            self.wait_ready([slot for slot in self.ready if lo <= slot < hi])

    def mark_used_range(self, lo: int, hi: int) -> None:
        """:meth:`mark_used_many` for the slots ``lo..hi-1``: one event, no work per slot."""
        event = self.backend.compute_event()
        if event is not None:
            self.in_use_ranges[(lo, hi)] = event

    def mark_used_many(self, slots) -> None:
        """:meth:`mark_used` for several slots read by one queued (grouped) computation: one event."""
        event = self.backend.compute_event()
        if event is not None:
            for slot in slots:
                self.in_use[int(slot)] = event

    def synchronize(self) -> None:
        """Wait for every copy in flight (before the slots are read outside the executor)."""
        if self.ready:
            self.wait_ready(list(self.ready))

    def weights(self, slot: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Views of a slot's (gate, up, down); compute first waits for its copy."""
        if slot in self.ready:
            self.backend.compute_wait(self.ready.pop(slot))
        return split_expert(self.pool[slot], self.store.hidden, self.store.inter)
