"""A recording fake of ``torch.cuda`` for the CUDA backend (``TorchCuda``'s calls), and a host-sync shim.

The CUDA backend (``oled_hf.offload.cuda_device.CudaDevice``) runs on the CPU with a :class:`FakeCuda`
in place of ``TorchCuda``: streams, events, stream waits, the copies a stream runs and the kernels
that read the slot pool are recorded in issue order (``log``) and checked against CUDA's ordering
rules as they are issued (``oled_hf.offload.ordering.StreamOrder``): a copy into a slot that a
kernel may still read, a copy that may land before an older copy into the same slot, or a kernel
that reads a slot before its copy's event was waited on its stream raises ``OrderViolation``.

Copies are seen where the cache writes a slot (``ExpertCache._copy``), kernel reads where the
executor's grouped or per-expert kernel reads slot rows (only groups with tokens are read): both by
:meth:`FakeCuda.watch`, independently of the backend's own bookkeeping.

An event completes only when the host synchronises on it or on a later event of its stream (the
worst case of a real device): a host wait that a real run could skip by luck is counted here. The
decoder's own synchronisation at the end of each forward (it reads the logits) is simulated by
:meth:`FakeCuda.decoder_sync`, uncounted.

:class:`SyncShim` counts every host synchronisation the offload code makes, per MoE layer call:
the fake's blocking event, stream and device synchronisations, plus any PyTorch call made directly
from ``oled_hf/offload`` that reads a non-pinned tensor on the host (``numpy``, ``tolist``,
``item``, ``cpu``, ``bool`` ...) or moves one with ``.to(device)`` without ``non_blocking``: on a GPU
each of those blocks the host until the device has caught up.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections import Counter

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from oled_hf.offload import executor as executor_module
from oled_hf.offload.cache import ExpertCache
from oled_hf.offload.ordering import HOST, StreamOrder

STREAMS = ("compute", "demand", "prefetch")


class FakeStream:
    def __init__(self, cuda: FakeCuda, name: str) -> None:
        self.cuda, self.name = cuda, name

    def wait_event(self, event: FakeEvent) -> None:
        self.cuda.log.append(("wait", self.name, event.id))
        if event.stamp is not None:
            self.cuda.order.wait(self.name, event.stamp)

    def synchronize(self) -> None:
        self.cuda.host_wait(self.cuda.order.stamp(self.name), f"stream {self.name}")

    def __repr__(self) -> str:
        return f"FakeStream({self.name})"


class FakeEvent:
    def __init__(self, cuda: FakeCuda, timing: bool) -> None:
        self.cuda, self.timing = cuda, timing
        self.stamp: np.ndarray | None = None
        self.id = next(cuda.ids)
        self.stream: str | None = None

    def record(self, stream: FakeStream) -> None:
        self.stamp, self.stream = self.cuda.order.stamp(stream.name), stream.name
        self.cuda.log.append(("record", stream.name, self.id))

    def query(self) -> bool:
        """Complete only once the host has synchronised past it."""
        return self.stamp is None or bool((self.cuda.order.clocks[0] >= self.stamp).all())

    def synchronize(self) -> None:
        if not self.query():
            self.cuda.host_wait(self.stamp, f"event {self.id}")

    def elapsed_time(self, end: FakeEvent) -> float:
        return 0.1 * (end.id - self.id)  # ms: deterministic, positive


class FakeCuda:
    """``TorchCuda``'s interface on the CPU, recording and checking what the CUDA backend issues."""

    def __init__(self) -> None:
        self.order = StreamOrder(STREAMS, 0)
        self.log: list[tuple] = []
        self.ids = iter(range(1, 1 << 62))
        self.current = FakeStream(self, "compute")
        self.host_syncs: list[str] = []  # what the host blocked on (counted by the shim)
        self.pinned_ptrs: set[int] = set()
        self.registered: list[int] = []  # bytes of each cudaHostRegister
        self.unregistered: list[int] = []
        self.pool: torch.Tensor | None = None
        self.lock = threading.Lock()

    # ---- TorchCuda's interface ----------------------------------------------------------------
    def stream(self, high_priority: bool) -> FakeStream:
        return FakeStream(self, "demand" if high_priority else "prefetch")

    def event(self, timing: bool = False) -> FakeEvent:
        return FakeEvent(self, timing)

    def current_stream(self) -> FakeStream:
        return self.current

    @contextlib.contextmanager
    def use(self, stream: FakeStream):
        outer, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = outer

    def pinned(self, shape, dtype) -> torch.Tensor:
        tensor = torch.empty(tuple(shape), dtype=dtype)
        self.pinned_ptrs.add(tensor.untyped_storage().data_ptr())
        return tensor

    def register(self, tensor: torch.Tensor) -> None:
        self.pinned_ptrs.add(tensor.untyped_storage().data_ptr())
        self.registered.append(tensor.numel() * tensor.element_size())

    def unregister(self, ptr: int) -> None:
        self.unregistered.append(ptr)

    def synchronize(self) -> None:
        stamp = np.max(self.order.clocks, axis=0)
        self.host_wait(stamp, "device")

    # ---- what the fake adds -----------------------------------------------------------------
    def host_wait(self, stamp: np.ndarray, what: str) -> None:
        with self.lock:  # the CPU experts' worker waits beside the main thread
            self.host_syncs.append(what)
            self.log.append(("host_wait", what, threading.current_thread() is threading.main_thread()))
            self.order.wait(HOST, stamp)

    def decoder_sync(self) -> None:
        """The decoder reads the forward's logits on the host: the device is idle afterwards (not counted)."""
        self.order.wait(HOST, np.max(self.order.clocks, axis=0))

    def track(self, slots: int) -> None:
        """Check the order of copies and reads of ``slots`` pool slots from here on (clocks kept)."""
        clocks = self.order.clocks.copy()
        self.order = StreamOrder(STREAMS, slots)
        self.order.clocks[:] = clocks

    def kernel(self, slots) -> None:
        """A kernel on the current stream that reads ``slots`` of the pool (what the executor's kernels record)."""
        self.log.append(("kernel", self.current.name, tuple(slots)))
        self.order.read(self.current.name, slots)

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        return tensor.untyped_storage().data_ptr() in self.pinned_ptrs

    def watch(self, cache: ExpertCache, monkeypatch) -> None:
        """Check every copy into and kernel read of ``cache``'s pool (patches the cache and the executor)."""
        self.pool = cache.pool
        self.track(cache.total_slots)
        row_bytes = cache.pool.stride(0) * cache.pool.element_size()
        base = cache.pool.data_ptr()
        copy = ExpertCache._copy

        def slot_of(tensor: torch.Tensor) -> int | None:
            off = tensor.data_ptr() - base
            return off // row_bytes if 0 <= off < cache.pool.numel() * cache.pool.element_size() else None

        def recorded_copy(self_, dst, layer, expert, non_blocking):
            slot = slot_of(dst)
            self.log.append(("copy", self.current.name, slot))
            self.order.write(self.current.name, [slot])
            return copy(self_, dst, layer, expert, non_blocking)

        grouped, loop = executor_module.grouped_swiglu, executor_module.swiglu_expert

        def recorded_grouped(x, gate_up, down, offs):
            lo = slot_of(gate_up)
            if lo is not None:  # the pool (not the store's CPU experts): groups with rows are read
                sizes = np.diff(offs.cpu().numpy(), prepend=0)
                slots = (lo + np.flatnonzero(sizes)).tolist()
                self.log.append(("kernel", self.current.name, tuple(slots)))
                self.order.read(self.current.name, slots)
            return grouped(x, gate_up, down, offs)

        def recorded_loop(x, gate, up, down):
            slot = slot_of(gate)
            if slot is not None and x.shape[0]:
                self.log.append(("kernel", self.current.name, (slot,)))
                self.order.read(self.current.name, [slot])
            return loop(x, gate, up, down)

        monkeypatch.setattr(ExpertCache, "_copy", recorded_copy)
        monkeypatch.setattr(executor_module, "grouped_swiglu", recorded_grouped)
        monkeypatch.setattr(executor_module, "swiglu_expert", recorded_loop)


BLOCKING = {"numpy", "tolist", "item", "cpu", "__bool__", "__int__", "__float__", "__index__", "nonzero"}


class SyncShim(TorchFunctionMode):
    """Counts host synchronisations of the offload code per MoE layer call (``layer``; -1 outside any call)."""

    def __init__(self, cuda: FakeCuda) -> None:
        super().__init__()
        self.cuda = cuda
        self.layer = -1
        self.counts: Counter[int] = Counter()
        self.what: list[tuple[int, str]] = []
        self._seen = len(cuda.host_syncs)  # from here on

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        caller = sys._getframe(1).f_code.co_filename
        if "/oled_hf/offload/" in caller and args and isinstance(args[0], torch.Tensor):
            self.cuda.kernel([])  # work on the current stream (a gather, an async copy): later events follow it
            blocking = name in BLOCKING or (name == "to" and not kwargs.get("non_blocking", False)
                                            and any(isinstance(a, (str, torch.device)) for a in args[1:]))
            if blocking and not self.cuda.is_pinned(args[0]):
                where = "/".join(caller.rsplit("/", 2)[-2:])
                self._count(f"{name} at {where}:{sys._getframe(1).f_lineno}")
        return func(*args, **kwargs)

    def _count(self, what: str) -> None:
        self.counts[self.layer] += 1
        self.what.append((self.layer, what))

    def collect(self) -> None:
        """Count the fake's host waits since the last call (they carry no frame of their own)."""
        for what in self.cuda.host_syncs[self._seen:]:
            self._count(what)
        self._seen = len(self.cuda.host_syncs)

    def watch_layers(self, monkeypatch) -> None:
        """Charge what runs inside each MoE layer's executor call to that layer."""
        call = executor_module.OffloadedExpertsExecutor.__call__
        shim = self

        def counted(self_, *args, **kwargs):
            shim.collect()
            outer, shim.layer = shim.layer, self_.moe_index
            try:
                return call(self_, *args, **kwargs)
            finally:
                shim.collect()
                shim.layer = outer

        monkeypatch.setattr(executor_module.OffloadedExpertsExecutor, "__call__", counted)


def fake_cuda_model(path, monkeypatch, **config):
    """An offloaded model whose pool runs on the CUDA backend over a :class:`FakeCuda` (copies and reads checked).

    Calibration is off (it times ``torch.cuda`` directly); the decoder's per-forward sync is simulated.
    """
    from oled_hf.modeling import OledLLaDA2ForDiffusionLM

    from oled_hf import OffloadConfig
    from oled_hf.offload import cache as cache_module
    from oled_hf.offload.cuda_device import CudaDevice

    cuda = FakeCuda()
    monkeypatch.setattr(cache_module, "make_device", lambda device, emulated=None: CudaDevice(torch.device("cpu"),
                                                                                               api=cuda))
    model = OledLLaDA2ForDiffusionLM.from_pretrained(path, offload_config=OffloadConfig(calibrate=False, **config))
    model.eval()
    rt = model._offload_runtime
    assert rt.cache.cuda and rt.overlap_cpu  # the CUDA paths: pinned transfers, the CPU worker beside the device
    cuda.watch(rt.cache, monkeypatch)
    model.register_forward_hook(lambda *_: cuda.decoder_sync())  # the decoder reads the logits on the host
    for block in model.moe_blocks():  # attention and router run on the compute stream before each MoE layer
        block.register_forward_pre_hook(lambda *_: cuda.kernel([]))
    return model, cuda
