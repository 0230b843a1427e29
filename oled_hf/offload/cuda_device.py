"""The CUDA backend: the slot pool in GPU memory, copies on two side streams, one event per wave.

Streams: demand copies on a high-priority stream, prefetch copies on a low-priority one, kernels on
the current (compute) stream. Ordering is the backend interface's (``backend.py``): a wave waits
the events in ``after`` on its stream (a kernel still reading a slot it overwrites, an earlier copy
into one of its slots), issues every copy, and records one event; compute waits for that event.

Host transfers never block except where the host needs the bytes: a download is a
``non_blocking`` copy into a pinned buffer plus an event, waited for (and counted) only when read;
an upload is staged through a ring of pinned buffers (``staging.py``) and copied ``non_blocking``.

Every CUDA call goes through :class:`TorchCuda`, the one place that touches ``torch.cuda``: the
tests put a recording fake there (``tests/offload/cuda_fake.py``) and run this backend on the CPU,
so the ordering and the host synchronisation of this file are tested where no GPU is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .backend import DEMAND, PREFETCH, Fill, Pending, SyncDevice
from .staging import PinnedRing

UPLOAD_BUFFERS = 4  # staging buffers of the upload ring (an upload's buffer is reused four uploads later)


class TorchCuda:
    """The ``torch.cuda`` calls the CUDA backend makes, for one device."""

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)

    def stream(self, high_priority: bool) -> Any:
        low, high = torch.cuda.Stream.priority_range()  # (least, greatest): greatest is the lower number
        return torch.cuda.Stream(device=self.device, priority=high if high_priority else low)

    def event(self, timing: bool = False) -> Any:
        return torch.cuda.Event(enable_timing=timing)

    def current_stream(self) -> Any:
        return torch.cuda.current_stream(self.device)

    def use(self, stream: Any) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(stream)

    def pinned(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(tuple(shape), dtype=dtype, pin_memory=True)

    def register(self, tensor: torch.Tensor) -> None:
        """Page-lock ``tensor``'s memory in place (no rounding, unlike the caching host allocator)."""
        code = int(torch.cuda.cudart().cudaHostRegister(tensor.data_ptr(), tensor.numel() * tensor.element_size(), 0))
        if code != 0:
            raise RuntimeError(f"cudaHostRegister of {tensor.numel() * tensor.element_size()} bytes failed "
                               f"(cudaError {code})")

    def unregister(self, ptr: int) -> None:
        torch.cuda.cudart().cudaHostUnregister(ptr)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)


class CudaDevice(SyncDevice):
    """A CUDA device: demand copies on a high-priority stream, prefetches on a low-priority one."""

    name = "cuda"
    asynchronous = True
    cuda = True
    fifo_streams = True

    def __init__(self, device: torch.device, api: Any | None = None) -> None:
        super().__init__(device)
        self.api = api if api is not None else TorchCuda(self.device)
        self.streams = {DEMAND: self.api.stream(True), PREFETCH: self.api.stream(False)}
        self.copy_stream = self.streams[DEMAND]  # what copy timing brackets (live_timing)
        self.uploads = PinnedRing(self.api, UPLOAD_BUFFERS, self.count_sync)

    def copy(self, slots: Sequence[int], fills: Sequence[Fill], nbytes: int, *, priority: int = DEMAND,
             after: Sequence[Any] = ()) -> Any:
        stream = self.streams[priority]
        for event in after:
            stream.wait_event(event)
        with self.api.use(stream):
            for fill in fills:
                fill(True)
            event = self.api.event()
            event.record(stream)
        return event

    def compute_event(self, slots: Any) -> Any:
        event = self.api.event()
        event.record(self.api.current_stream())
        return event

    def compute_wait(self, event: Any) -> None:
        self.api.current_stream().wait_event(event)

    def pinned(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        return self.api.pinned(shape, dtype)

    def download(self, tensor: torch.Tensor, buffer: torch.Tensor | None = None) -> Pending:
        host = buffer if buffer is not None else self.pinned(tensor.shape, tensor.dtype)
        host.copy_(tensor, non_blocking=True)
        event = self.api.event()
        event.record(self.api.current_stream())
        return Pending(host, event)

    def wait(self, pending: Pending) -> torch.Tensor:
        self.count_sync()
        pending.event.synchronize()
        return pending.host

    def upload(self, host: torch.Tensor | np.ndarray) -> torch.Tensor:
        tensor = torch.from_numpy(host) if isinstance(host, np.ndarray) else host
        staged = self.uploads.stage(tensor)
        out = torch.empty(staged.shape, dtype=staged.dtype, device=self.device)  # never an alias of the ring
        out.copy_(staged, non_blocking=True)
        event = self.api.event()
        event.record(self.api.current_stream())
        self.uploads.release(event)
        return out

    def staging_ring(self, buffers: int) -> PinnedRing:
        """A ring of pinned buffers for copies from pageable memory (the memory-mapped store)."""
        return PinnedRing(self.api, buffers, self.count_sync)

    def synchronize(self) -> None:
        self.count_sync()
        self.api.synchronize()
