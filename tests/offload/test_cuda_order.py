"""The CUDA backend's ordering, on the CPU: a recording fake of ``torch.cuda`` checks every copy and kernel read.

Per slot: copy -> every kernel read -> next copy, across the demand and the prefetch streams, and no
kernel reads a slot before its copy's event was waited on its stream (``tests/offload/cuda_fake.py``).
A scripted sequence of the slot pool's operations exercises each kind of wait; dropping any one of
them (each ``after`` event of a copy wave, each compute wait) makes the checker fail. Then whole
offloaded generates run on the fake CUDA backend, every system kind, and keep the order.
"""

import pytest
import torch

from oled_hf.offload.backend import DEMAND, PREFETCH
from oled_hf.offload.cache import ExpertCache
from oled_hf.offload.cuda_device import CudaDevice
from oled_hf.offload.ordering import OrderViolation
from tests.offload.cuda_fake import FakeCuda, fake_cuda_model
from tests.offload.stub_store import StubStore


class DroppingCuda(CudaDevice):
    """The CUDA backend with the ``drop``-th wait it makes left out (None: none); counts the waits."""

    def __init__(self, api, drop=None):
        super().__init__(torch.device("cpu"), api=api)
        self.drop, self.waits = drop, 0

    def _keep(self) -> bool:
        self.waits += 1
        return self.waits - 1 != self.drop

    def copy(self, slots, fills, nbytes, *, priority=DEMAND, after=()):
        return super().copy(slots, fills, nbytes, priority=priority, after=[e for e in after if self._keep()])

    def compute_wait(self, event):
        if self._keep():
            super().compute_wait(event)


def _cache(monkeypatch, drop=None, slots=6):
    cuda = FakeCuda()
    backend = DroppingCuda(cuda, drop)
    cache = ExpertCache(StubStore(8), slots, torch.device("cpu"), backend)
    cuda.watch(cache, monkeypatch)  # every copy into the pool is checked
    return cache, cuda, backend


def _kernel(cache, cuda, slots):
    """What the executor does for one grouped call: wait for the slots' copies, read them, mark them read."""
    cache.wait_ready(slots)
    cuda.kernel(slots)
    cache.mark_used_many(slots)


def _script(cache, cuda):
    """Every kind of wait the pool makes, once, none implied by another: layer A holds slots 0-2 (all hits),
    layer B slots 3-5."""
    cache.load_wave([0, 1, 2], 0, [0, 1, 2])  # demand wave; the all-hits kernel waits for it
    cache.wait_ready_range(0, 3)
    cuda.kernel(range(3))
    cache.mark_used_range(0, 3)
    cache.load_wave([3, 4], 1, [3, 4], priority=PREFETCH)  # prefetched for layer B; its kernel waits for it
    _kernel(cache, cuda, [3, 4])
    cache.load_wave([1], 0, [5])  # demand copy into the range the all-hits kernel reads: waits for it
    cache.load_wave([2], 0, [6], priority=PREFETCH)  # prefetch copy into the same range: waits for it too
    cache.load_wave([3], 1, [7])  # demand copy into a slot a planned kernel read
    cache.load_wave([5], 1, [5], priority=PREFETCH)
    cache.load_wave([5], 1, [6])  # demand copy into a slot whose prefetch copy nobody read yet
    _kernel(cache, cuda, [1, 2])  # a demand and a prefetch wave
    _kernel(cache, cuda, [3])
    _kernel(cache, cuda, [5])


def test_the_scripted_waves_keep_the_order_and_land_the_right_bytes(monkeypatch):
    cache, cuda, backend = _cache(monkeypatch)
    _script(cache, cuda)
    assert backend.waits == 10  # 4 copy waves wait for a kernel or an earlier copy, 6 kernels' waits for copies
    assert [float(cache.pool[s, 0]) for s in range(6)] == [1.0, 6.0, 7.0, 8.0, 5.0, 7.0]
    assert cache.waves == 7 and sum(op[0] == "record" for op in cuda.log) == 7 + 5  # an event a wave, a kernel


@pytest.mark.parametrize("drop", range(10))
def test_removing_any_one_wait_breaks_the_order(monkeypatch, drop):
    cache, cuda, backend = _cache(monkeypatch, drop)
    with pytest.raises(OrderViolation):
        _script(cache, cuda)


def test_a_prefetch_into_slots_the_all_hits_kernel_reads_waits_for_it_after_a_demand_copy_did(monkeypatch):
    """The cross-stream race: the range's kernel event was dropped once the first (demand) copy waited for it,
    so a later prefetch copy into the range, on the other stream, overwrote a slot the kernel still read."""
    cache, cuda, _ = _cache(monkeypatch)
    cache.load_wave([0, 1, 2], 0, [0, 1, 2])
    cache.wait_ready_range(0, 3)
    cuda.kernel(range(3))
    cache.mark_used_range(0, 3)
    cache.load_wave([0], 0, [5])  # the demand stream waits for the kernel
    cache.load_wave([1], 1, [6], priority=PREFETCH)  # the prefetch stream must wait for it as well
    waits = [op for op in cuda.log if op[0] == "wait"]
    assert [w[1] for w in waits[-2:]] == ["demand", "prefetch"] and waits[-1][2] == waits[-2][2]


def test_a_superseded_copy_on_one_stream_orders_the_next_on_the_other(monkeypatch):
    cache, cuda, _ = _cache(monkeypatch)
    cache.load_wave([4], 0, [1], priority=PREFETCH)
    cache.load_wave([4], 0, [2])  # nobody read the prefetch: the demand copy still lands after it
    _kernel(cache, cuda, [4])
    assert float(cache.pool[4, 0]) == 3.0


# ---- whole generates on the fake CUDA backend -------------------------------------------------------

PROMPT = torch.tensor([[5, 17, 42, 99, 3, 250, 7, 64, 11, 300, 2, 8, 77, 120, 33, 6]])
GEN = dict(max_new_tokens=16, block_length=8, threshold=0.9)


@pytest.mark.parametrize("system, cache_size, cpu", [
    ("oled", 6, "on"),  # CPU misses, reuse copies, layer-adaptive rebalancing
    ("oled+previous", 4, "off"),  # prefetches on the low-priority stream
    ("lru+previous+copy+uniform", 2, "off"),  # streamed: more distinct experts than slots in a layer
    ("lru-full", 32, "off"),  # room for every expert: each copied once, never evicted
])
def test_generate_on_the_fake_cuda_backend_keeps_the_order_and_the_tokens(tiny_path, tiny_model, monkeypatch,
                                                                        system, cache_size, cpu):
    reference = tiny_model.generate(PROMPT, **GEN)
    model, cuda = fake_cuda_model(tiny_path, monkeypatch, cache_size=cache_size, system=system, cpu_compute=cpu)
    if system == "oled+previous":
        model._offload_runtime.cost_model.nonexpert_s_per_layer = 1e-3  # believed idle copy time: room to prefetch
    assert torch.equal(model.generate(PROMPT, **GEN), reference)
    kernels = [op for op in cuda.log if op[0] == "kernel"]
    copies = [op for op in cuda.log if op[0] == "copy"]
    assert kernels and cuda.order.operations >= len(kernels) + len(copies)
    stats = model.offload_stats()
    if system == "oled+previous":
        assert stats["prefetches"] > 0 and any(op[1] == "prefetch" for op in copies)
    if cache_size == 32:
        assert stats["total"]["misses"] == len(copies) and stats["total"]["evictions"] == 0
