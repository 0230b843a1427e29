"""A store or a resident load that the host's memory cannot take is refused or moved to mmap, before allocating."""

from __future__ import annotations

import logging

import pytest
import torch
from oled_hf.modeling import placement

from oled_hf.offload.config import OffloadConfig
from oled_hf.offload.store import choose_store

GIB = 1 << 30


def test_choose_store_keeps_pinned_where_it_fits_and_maps_the_rest():
    # 24 GiB host: 2.4 GiB kept free
    assert choose_store("auto", 10 * GIB, 2 * GIB, 20 * GIB, 24 * GIB) == "pinned"
    assert choose_store("pinned", 10 * GIB, 0, 20 * GIB, 24 * GIB) == "pinned"
    assert choose_store("mmap", 100 * GIB, 0, 1 * GIB, 24 * GIB) == "mmap"
    assert choose_store("auto", 30 * GIB, 0, 20 * GIB, 24 * GIB) == "mmap"
    assert choose_store("auto", 17 * GIB, 1 * GIB, 20 * GIB, 24 * GIB) == "mmap"  # the cache beside it counts
    with pytest.raises(ValueError, match=r"^the routed experts need 30\.0 GiB of host memory in store='pinned', the "
                                         r"host has 20\.0 GiB available \(2\.4 GiB kept free\): use store='mmap'"):
        choose_store("pinned", 30 * GIB, 0, 20 * GIB, 24 * GIB)


# headroom leaving 6 MB of a 1.5 GiB host: the tiny model's non-expert weights (~2.6 MB) fit, its experts (9.4 MB) not
LEFT = int(1.5 * GIB) - (6 << 20)


@pytest.fixture
def small_host(monkeypatch):
    """A host with 1.5 GiB available of 2 GiB."""
    monkeypatch.setattr(placement, "host_memory", lambda: (int(1.5 * GIB), 2 * GIB))


def test_auto_store_falls_back_to_mmap_in_one_line(tiny_path, small_host, monkeypatch, caplog):
    from oled_hf.modeling import OledLLaDA2ForDiffusionLM

    from oled_hf.offload import store

    monkeypatch.setattr(placement, "HOST_HEADROOM_MIN", LEFT)
    with caplog.at_level(logging.WARNING, logger=store.__name__):
        model = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, offload_config=OffloadConfig(cache_size=8))
    assert model._offload_runtime.store.mode == "mmap"
    lines = [r.getMessage() for r in caplog.records if r.name == store.__name__]
    assert len(lines) == 1 and "using store='mmap' instead" in lines[0]


def test_pinned_store_that_cannot_fit_is_refused_naming_mmap(tiny_path, small_host, monkeypatch):
    from oled_hf.modeling import OledLLaDA2ForDiffusionLM

    monkeypatch.setattr(placement, "HOST_HEADROOM_MIN", LEFT)
    with pytest.raises(ValueError, match=r"store='pinned'.*use store='mmap'"):
        OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, offload_config=OffloadConfig(cache_size=8, store="pinned"))


def test_resident_load_larger_than_the_host_is_refused_in_one_line(tiny_path, tiny_model, monkeypatch):
    from oled_hf.modeling import OledLLaDA2ForDiffusionLM

    before = {k: v.clone() for k, v in list(tiny_model.state_dict().items())[:3]}
    monkeypatch.setattr(placement, "host_memory", lambda: (16 << 20, 2 * GIB))  # as much as the load kept free
    with pytest.raises(ValueError, match=r"^loading this checkpoint resident needs 11\.0 MiB of host memory for its "
                                         r"weights, but the host has 16\.0 MiB available \(11\.0 MiB kept free\): "
                                         r"load it with its routed experts offloaded"):
        OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path)
    assert all(torch.equal(tiny_model.state_dict()[k], v) for k, v in before.items())  # a loaded model untouched


# ---- what the pinned store reserves; the memory-mapped store's copies on CUDA --------------------------------

def _tiny_store(tiny_path, mode, pin):
    from oled_hf.modeling import OledLLaDA2Config

    from oled_hf.offload.store import ExpertStore

    cfg = OledLLaDA2Config.from_pretrained(tiny_path)
    files = sorted(str(f) for f in tiny_path.glob("*.safetensors"))
    layers = list(range(cfg.first_k_dense_replace, cfg.num_hidden_layers))
    return ExpertStore.from_safetensors(files, layers, cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size,
                                        torch.float32, mode, pin=pin), cfg


def test_the_pinned_store_is_page_locked_in_place_at_the_size_its_fit_check_counts(tiny_path, monkeypatch):
    """``pin_memory=True`` goes through the caching host allocator, which rounds each layer buffer up to a power of
    two (1.5 GiB -> 2 GiB at LLaDA2.0-mini's size) while the fit check counted the exact bytes."""
    import gc

    from oled_hf.offload import store as store_module
    from tests.offload.cuda_fake import FakeCuda

    cuda, asked, empty = FakeCuda(), [], torch.empty

    def recording_empty(*args, **kwargs):
        asked.append(kwargs.pop("pin_memory", False))
        return empty(*args, **kwargs)

    counted = []
    choose = store_module.choose_store
    monkeypatch.setattr(store_module, "choose_store", lambda mode, nbytes, *a: counted.append(nbytes) or choose(
        mode, nbytes, *a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a CUDA host: the store pins its layers
    monkeypatch.setattr(store_module, "default_host_pin", lambda: cuda)
    monkeypatch.setattr(torch, "empty", recording_empty)
    store, cfg = _tiny_store(tiny_path, "pinned", "auto")
    monkeypatch.setattr(torch, "empty", empty)
    layer_bytes = cfg.num_experts * store.expert_bytes
    assert not any(asked)  # no block from the caching host allocator
    assert cuda.registered == [layer_bytes] * len(store.layer_ids)  # each layer locked at its exact size
    assert counted == [store_module.pinned_reserve_bytes(layer_bytes, len(store.layer_ids))]
    assert sum(cuda.registered) <= counted[0] < sum(cuda.registered) + store_module.PAGE * len(store.layer_ids)
    ptrs = [b.data_ptr() for b in store.buffers]
    del store
    gc.collect()
    assert cuda.unregistered == ptrs  # unlocked when the store goes


def test_memory_mapped_rows_reach_the_device_through_the_pinned_staging_ring(tiny_path, monkeypatch):
    """A ``non_blocking`` copy from a mapped (pageable) row is staged by the driver while the host waits: every
    copy into the pool on CUDA now reads a pinned staging buffer, reused only once its copy has completed."""
    import sys

    from torch.overrides import TorchFunctionMode

    from oled_hf.offload.cache import STAGING_BUFFERS, ExpertCache
    from oled_hf.offload.cuda_device import CudaDevice
    from tests.offload.cuda_fake import FakeCuda

    store, cfg = _tiny_store(tiny_path, "mmap", None)
    cuda = FakeCuda()
    cache = ExpertCache(store, 24, torch.device("cpu"), CudaDevice(torch.device("cpu"), api=cuda))
    cuda.watch(cache, monkeypatch)
    sources = []

    class Copies(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if getattr(func, "__name__", "") == "copy_" and "/oled_hf/offload/cache.py" in \
                    sys._getframe(1).f_code.co_filename:
                sources.append((cuda.is_pinned(args[1]), kwargs.get("non_blocking", False)))
            return func(*args, **kwargs)

    n = STAGING_BUFFERS + 4  # one wave longer than the ring: it releases what it staged, then waits for it
    with Copies():
        cache.load_wave(list(range(n)), 0, list(range(n)))
    assert len(sources) == n and all(pinned and non_blocking for pinned, non_blocking in sources)
    assert cache.staging.waits == 1 and cache.backend.syncs[-1] == 1  # one wait frees the 8: a counted host sync
    cache.wait_ready(range(n))
    cuda.kernel(range(n))
    for e in range(n):
        assert torch.equal(cache.pool[e], torch.cat([w.reshape(-1) for w in store.weights(0, e)]))
