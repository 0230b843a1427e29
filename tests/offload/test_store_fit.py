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
