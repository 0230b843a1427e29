"""The device backend's interface, and the CPU (or any non-CUDA device) as its own synchronous device.

The slot pool (``cache.py``) and the executor move bytes and order work only through this
interface, so one executor runs on three backends (``device.py`` picks one): this synchronous
one, ``CudaDevice`` (``cuda_device.py``) and ``EmulatedDevice`` (``emulated.py``).

* Copies go in **waves** (``copy``): the copies of one wave are issued together on one stream and
  complete one event, so a wave costs a handful of API calls, not four per copy.
* Kernel reads are marked with ``compute_event(slots)``, so a later copy into those slots can be
  made to wait for the kernel (``after``); ``compute_wait`` makes compute wait for a copy.
* Host transfers: ``download`` starts a device-to-host transfer into a (pinned) host buffer and
  returns a :class:`Pending`; ``upload`` moves host data to the device without ever copying
  ``non_blocking`` from pageable memory. A host wait for the device is **counted**
  (:meth:`SyncDevice.count_sync`) where the code blocks on CUDA; the same points are counted on
  every backend, so ``offload_stats()["host_syncs"]`` reads the same on a CPU run as on a GPU.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

DEMAND, PREFETCH = 0, 1  # copy priorities (streams): a lower value goes first
OUTSIDE = -1  # the layer a host sync is charged to outside any MoE layer's call

Fill = Callable[[bool], None]  # writes one copy's bytes; the argument: non_blocking


class Pending:
    """A device-to-host transfer on its way: ``host`` holds its bytes once the transfer has landed."""

    __slots__ = ("host", "event")

    def __init__(self, host: torch.Tensor, event: Any = None) -> None:
        self.host, self.event = host, event

    def ready(self) -> bool:
        """Whether the bytes have landed (never blocks)."""
        return self.event is None or bool(self.event.query())


class SyncDevice:
    """A device whose work is synchronous (the CPU): copies have landed when ``copy`` returns, no events."""

    name = "cpu"
    asynchronous = False
    cuda = False
    can_cancel = False
    fifo_streams = False  # copies on one stream complete in issue order (CUDA streams do)

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.layer = OUTSIDE  # the MoE layer whose call is running (the executor sets it): syncs are charged to it
        self.syncs: Counter[int] = Counter()
        self._sync_lock = threading.Lock()  # the CPU worker counts beside the main thread

    # ---- memory ---------------------------------------------------------------------------
    def allocate(self, rows: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty((rows, numel), dtype=dtype, device=self.device)

    def pinned(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """A host buffer for transfers (page-locked on CUDA)."""
        return torch.empty(tuple(shape), dtype=dtype)

    # ---- copies and their order -------------------------------------------------------------
    def copy(self, slots: Sequence[int], fills: Sequence[Fill], nbytes: int, *, priority: int = DEMAND,
             after: Sequence[Any] = ()) -> Any:
        """One wave: ``fills[i]`` writes slot ``slots[i]`` (``nbytes`` each) after the events ``after``."""
        for fill in fills:
            fill(False)
        return None

    def cancel(self, event: Any, slot: int) -> bool:
        """Drop ``slot``'s copy of a wave that has not started (only the emulated device can)."""
        return False

    def compute_event(self, slots: Any) -> Any:
        """An event after the kernels queued so far, which read ``slots`` (a list, array or range)."""
        return None

    def compute_wait(self, event: Any) -> None:
        """Make compute wait for ``event`` (a copy's)."""

    # ---- host transfers -----------------------------------------------------------------------
    def download(self, tensor: torch.Tensor, buffer: torch.Tensor | None = None) -> Pending:
        """Start moving ``tensor`` to the host (into ``buffer`` where the backend needs one)."""
        return Pending(tensor if tensor.device.type == "cpu" else tensor.cpu())

    def wait(self, pending: Pending) -> torch.Tensor:
        """The transfer's host bytes; blocks until they landed. Counted: a host sync on CUDA."""
        self.count_sync()
        return self.finish(pending)

    def finish(self, pending: Pending) -> torch.Tensor:
        """The host bytes of a transfer that is known to have landed (``ready()``), or waited for uncounted."""
        if pending.event is not None:
            pending.event.synchronize()
        return pending.host

    def to_host(self, tensor: torch.Tensor, buffer: torch.Tensor | None = None) -> np.ndarray:
        """``tensor`` on the host as NumPy, now: one counted host sync."""
        return self.wait(self.download(tensor, buffer)).numpy()

    def upload(self, host: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Host data on the device, issued on the compute stream (never ``non_blocking`` from pageable memory)."""
        tensor = torch.from_numpy(host) if isinstance(host, np.ndarray) else host
        return tensor if self.device.type == "cpu" else tensor.to(self.device)

    def synchronize(self) -> None:
        """Block until the device is idle (profiling; counted)."""
        self.count_sync()

    def count_sync(self) -> None:
        with self._sync_lock:
            self.syncs[self.layer] += 1

    def close(self) -> None:
        pass
