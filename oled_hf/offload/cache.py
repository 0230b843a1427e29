"""ExpertCache: the device slot pool, allocated once, and the copies that fill it.

``total_slots`` rows of ``3*I*H`` elements on the model's device: the device never holds more
routed-expert bytes than that. Which expert sits in which slot is the planner's business
(``CacheState``); this class only moves bytes. On CUDA, copies run on a side stream from pinned
memory and each slot carries an event, so compute waits for exactly the copy it needs while
other copies and compute overlap; on the CPU the same calls copy synchronously.

Each slot carries a tag, ``slot_tags[slot] = (layer, expert)``, written only once that expert's
copy has been issued without error (``(-1, -1)`` while a copy is in flight or after one failed):
the ground truth ``CacheState.check_invariants`` and ``CacheState.reconcile`` compare the
bookkeeping against.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from .store import ExpertStore, split_expert


class ExpertCache:
    def __init__(self, store: ExpertStore, total_slots: int, device: torch.device):
        self.store = store
        self.device = torch.device(device)
        self.total_slots = total_slots
        self.pool = torch.empty((total_slots, store.numel), dtype=store.dtype, device=self.device)
        self.cuda = self.device.type == "cuda"
        self.copy_stream = torch.cuda.Stream(device=self.device) if self.cuda else None
        self.ready: dict[int, torch.cuda.Event] = {}  # slot -> its copy has landed
        self.in_use: dict[int, torch.cuda.Event] = {}  # slot -> compute reading it has finished
        self.in_use_ranges: dict[tuple[int, int], torch.cuda.Event] = {}  # (lo, hi) -> ditto, for a slot range
        self.copy_seconds = 0.0
        self.bytes_copied = 0
        self.slot_tags = np.full((total_slots, 2), -1, dtype=np.int64)  # (layer, expert) each slot holds

    @property
    def pool_bytes(self) -> int:
        return self.pool.numel() * self.pool.element_size()

    def load(self, slot: int, layer: int, expert: int) -> None:
        """Copy an expert from the store into ``slot``; asynchronous on CUDA."""
        start = time.perf_counter()
        dst = self.pool[slot]
        self.slot_tags[slot] = -1  # overwritten from here on: holds no whole expert until the copy is done
        if self.cuda:
            # Compute queued earlier may still read this slot's previous expert: wait for it only.
            if slot in self.in_use:
                self.copy_stream.wait_event(self.in_use.pop(slot))
            for lo, hi in [r for r in self.in_use_ranges if r[0] <= slot < r[1]]:
                # once waited for, later copies queue behind it on the copy stream: forget it
                self.copy_stream.wait_event(self.in_use_ranges.pop((lo, hi)))
            with torch.cuda.stream(self.copy_stream):
                self._copy(dst, layer, expert, non_blocking=True)
                event = torch.cuda.Event()
                event.record(self.copy_stream)
            self.ready[slot] = event
        else:
            self._copy(dst, layer, expert, non_blocking=False)
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
        if self.cuda:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
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
        """On CUDA, make the current stream wait for the copies into ``slots`` still in flight."""
        if self.cuda and self.ready:
            stream = torch.cuda.current_stream(self.device)
            for slot in slots:
                event = self.ready.pop(int(slot), None)
                if event is not None:
                    stream.wait_event(event)

    def wait_ready_range(self, lo: int, hi: int) -> None:
        """:meth:`wait_ready` for the slots ``lo..hi-1`` (only copies still in flight are looked at)."""
        if self.cuda and self.ready:
            self.wait_ready([slot for slot in self.ready if lo <= slot < hi])

    def mark_used_range(self, lo: int, hi: int) -> None:
        """:meth:`mark_used_many` for the slots ``lo..hi-1``: one event, no work per slot."""
        if self.cuda:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
            self.in_use_ranges[(lo, hi)] = event

    def mark_used_many(self, slots) -> None:
        """:meth:`mark_used` for several slots read by one queued (grouped) computation: one event."""
        if self.cuda:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
            for slot in slots:
                self.in_use[int(slot)] = event

    def weights(self, slot: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Views of a slot's (gate, up, down); on CUDA the current stream first waits for its copy."""
        if self.cuda and slot in self.ready:
            torch.cuda.current_stream(self.device).wait_event(self.ready.pop(slot))
        return split_expert(self.pool[slot], self.store.hidden, self.store.inter)
