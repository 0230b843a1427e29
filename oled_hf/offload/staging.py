"""A ring of pinned host buffers that host-to-device copies from pageable memory are staged through.

Why: a ``non_blocking`` copy from pageable memory (a memory-mapped safetensors row, a tensor the
CPU experts just computed, an index array) is not asynchronous: the driver first stages it
through its own pinned buffer while the host waits, possibly behind earlier work on the stream.
So the host copies such bytes into one of a few page-locked buffers of its own, then issues a
truly asynchronous copy from it. A buffer is written again only after the copy that read it has
completed: the event :meth:`PinnedRing.release` attaches to it says when. The host waits for that
event (a counted host sync) only if it has not completed, which happens only when the host runs
more than ``n`` stagings ahead of the device; a wave longer than the ring releases what it has
staged so far with an event of its own before it reuses a buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


class PinnedRing:
    """``n`` pinned byte buffers used in turn, each reusable once the event of its last copy completed."""

    def __init__(self, api: Any, n: int, on_sync: Callable[[], None]) -> None:
        if n < 1:
            raise ValueError(f"a staging ring needs at least one buffer, got {n}")
        self.api, self.on_sync = api, on_sync
        self.buffers: list[torch.Tensor | None] = [None] * n
        self.events: list[Any] = [None] * n  # the event after the copy that last read each buffer
        self.unreleased: list[int] = []  # staged since the last release (their copies have no event yet)
        self.next = 0
        self.waits = 0  # times the host waited for a buffer (each also counted by on_sync)

    def stage(self, parts: Sequence[torch.Tensor] | torch.Tensor) -> torch.Tensor:
        """The bytes of ``parts`` (host tensors of one dtype) back to back in a pinned buffer.

        One tensor comes back in its shape, several as one flat tensor. Copy from it (``non_blocking``)
        on the current stream, then :meth:`release` an event recorded after that copy.
        """
        parts = [parts] if isinstance(parts, torch.Tensor) else list(parts)
        dtype = parts[0].dtype
        nbytes = sum(p.numel() for p in parts) * parts[0].element_size()
        i = self._take()
        buf = self.buffers[i]
        if buf is None or buf.numel() < nbytes:
            buf = self.buffers[i] = self.api.pinned((max(nbytes, 1),), torch.uint8)
        flat = buf[:nbytes].view(dtype)
        at = 0
        for p in parts:
            flat[at : at + p.numel()].copy_(p.reshape(-1))
            at += p.numel()
        self.unreleased.append(i)
        return flat.view(parts[0].shape) if len(parts) == 1 else flat

    def release(self, event: Any) -> None:
        """``event`` completes once every copy from the buffers staged since the last release has."""
        for i in self.unreleased:
            self.events[i] = event
        self.unreleased.clear()

    def _take(self) -> int:
        """The next buffer, free to overwrite: its last copy has completed (waited for if needed)."""
        i = self.next
        self.next = (i + 1) % len(self.buffers)
        if i in self.unreleased:  # the ring wrapped inside one wave: give what is staged so far an event
            event = self.api.event()
            event.record(self.api.current_stream())
            self.release(event)
        event, self.events[i] = self.events[i], None
        if event is not None and not event.query():
            self.waits += 1
            self.on_sync()
            event.synchronize()
        return i
