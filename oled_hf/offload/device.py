"""The device backend under the slot pool: which one a load gets, and the names the rest of the package uses.

Three backends share one interface (``backend.py``):

* ``SyncDevice`` (``backend.py``): the CPU as its own device; synchronous copies, no events.
* ``CudaDevice`` (``cuda_device.py``): the pool in GPU memory; demand copies on a high-priority
  side stream, prefetches on a low-priority one; one event per copy wave and per kernel that
  reads slots; pinned host transfers.
* ``EmulatedDevice`` (``emulated.py``): an asynchronous device on any CPU, with a timed copy
  worker and CUDA's ordering checked as work is issued, so the synchronisation can be tested and
  timed where there is no GPU.
"""

from __future__ import annotations

import torch

from .backend import DEMAND, OUTSIDE, PREFETCH, Pending, SyncDevice
from .cuda_device import CudaDevice, TorchCuda
from .emulated import (
    DEFAULT_LATENCY_S,
    MINI_EXPERT_BYTES,
    PCIE5_BYTES_PER_S,
    CopyFailed,
    EmulatedDevice,
    EmulatedEvent,
    check_link,
    default_bandwidth,
)

DEVICES = ("cpu", "cuda", "emulated")

__all__ = ["DEFAULT_LATENCY_S", "DEMAND", "DEVICES", "MINI_EXPERT_BYTES", "OUTSIDE", "PCIE5_BYTES_PER_S", "PREFETCH",
           "CopyFailed", "CudaDevice", "EmulatedDevice", "EmulatedEvent", "Pending", "SyncDevice", "TorchCuda",
           "check_link", "default_bandwidth", "make_device"]


def make_device(device: torch.device, emulated: EmulatedDevice | None = None) -> SyncDevice:
    """The backend of a pool on ``device`` (``emulated``: the emulated device, whatever ``device`` is)."""
    if emulated is not None:
        return emulated
    device = torch.device(device)
    return CudaDevice(device) if device.type == "cuda" else SyncDevice(device)
