"""Issue 67 item 4: accelerate's ``max_memory`` beside ``offload_config`` (it was refused: the budget had to go in
as ``OffloadConfig(max_gpu_memory=...)``). The device entry is the device's whole budget, non-expert weights
included; the cpu entry caps host memory, choosing the memory-mapped store where a host copy would pass it."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
from oled_hf.modeling import OledLLaDA2ForDiffusionLM

from oled_hf.offload import max_memory as max_memory_module
from oled_hf.offload.budget import MaxMemory, parse_max_memory
from oled_hf.offload.config import OffloadConfig

PROMPT = torch.tensor([[5, 17, 42, 99, 3, 250, 7, 64, 11, 300, 2, 8]])
GEN = dict(max_new_tokens=16, block_length=8)
MIB = 1 << 20
EXPERT = 3 * 128 * 64 * 4  # the tiny preset's routed expert (hidden 128, width 64, float32): 96 KiB


@pytest.fixture(scope="module")
def resident_tokens(tiny_model):
    return tiny_model.generate(PROMPT, **GEN)


@pytest.fixture(scope="module")
def offloaded(tiny_path):
    """An offloaded tiny model: its parameters are the non-expert weights."""
    return OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, offload_config=OffloadConfig(cache_size=2))


def non_expert_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def test_parse_max_memory_reads_accelerates_keys():
    assert parse_max_memory({0: "20GiB", "cpu": "60GiB"}) == MaxMemory("cuda:0", 20 << 30, 60 << 30)
    assert parse_max_memory({"cuda:1": 1000, "cpu": "1000"}) == MaxMemory("cuda:1", 1000, 1000)
    assert parse_max_memory({"cuda": "1MiB"}) == MaxMemory("cuda:0", MIB, None)
    assert parse_max_memory({"cpu": "1MiB"}) == MaxMemory(None, None, MIB)
    for bad, message in (({}, "must be a non-empty dict"), ({"mps": "1GiB"}, "key 'mps' is invalid"),
                         ({True: "1GiB"}, "key True is invalid"), ({0: "1e400GiB"}, "max_memory[0]='1e400GiB'"),
                         ({0: "1GiB", "cuda:2": "1GiB"}, "names 2 devices")):
        with pytest.raises(ValueError, match=None) as info:
            parse_max_memory(bad)
        assert message in str(info.value), (bad, str(info.value))


def test_the_device_entry_alone_is_a_budget_and_round_trips():
    config = OffloadConfig(max_memory={0: "20GiB", "cpu": "60GiB"})
    assert OffloadConfig.from_json(config.to_json()) == config  # {"0": ...} in JSON is device 0 again
    with pytest.raises(ValueError, match="needs exactly one budget.*or accelerate's max_memory with a device entry"):
        OffloadConfig(max_memory={"cpu": "60GiB"})
    with pytest.raises(ValueError, match="cache_ratio='auto' and max_memory's cuda:0 entry both size"):
        OffloadConfig(cache_ratio="auto", max_memory={0: "20GiB"})
    with pytest.raises(ValueError, match="becomes the expert budget when the model loads"):
        config.resolve_slots(3, 64)
    assert OffloadConfig(cache_size=4, max_memory={0: "1GiB"}).with_max_memory({0: "1GiB"}).cache_size == 4
    with pytest.raises(ValueError, match="given to from_pretrained and max_memory=.* to OffloadConfig: give it once"):
        OffloadConfig(cache_size=4, max_memory={0: "1GiB"}).with_max_memory({0: "2GiB"})


def test_a_cpu_cap_that_holds_the_store_keeps_it(tiny_path, resident_tokens):
    model = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, offload_config=OffloadConfig(cache_size=4),
                                                     max_memory={"cpu": "1GiB"})
    assert model._offload_runtime.store.mode == "pinned"
    assert torch.equal(model.generate(PROMPT, **GEN), resident_tokens)


def test_a_cpu_cap_below_the_store_picks_the_memory_mapped_one(tiny_path, resident_tokens, caplog):
    """The tiny model: 2.0 MiB of non-expert weights, 9.0 MiB of routed experts (3 MoE layers x 32 x 96 KiB), a
    cache of 4 x 3 slots (1.1 MiB); a 6 MiB cap holds the weights and the cache, not a host copy of every expert."""
    with caplog.at_level(logging.WARNING, logger=max_memory_module.__name__):
        model = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, offload_config={"cache_size": 4},
                                                         max_memory={"cpu": "6MiB"})
    assert model._offload_runtime.store.mode == "mmap"
    assert [r.getMessage() for r in caplog.records] == [
        "the routed experts (9.0 MiB) do not fit max_memory['cpu'] (6.0 MiB) beside what else the host holds "
        "(3.1 MiB): using store='mmap' (read from the checkpoint's files, page cache the kernel reclaims)"]
    assert torch.equal(model.generate(PROMPT, **GEN), resident_tokens)


@pytest.mark.parametrize("store, cap, message", [
    ("pinned", "6MiB", r"store='pinned' holds every routed expert in host memory \(9\.0 MiB beside 3\.1 MiB\), more "
                       r"than max_memory\['cpu'\] \(6\.0 MiB\); use store='mmap'"),
    ("auto", "2MiB", r"on the CPU the non-expert weights \(2\.0 MiB\) and the expert cache \(1\.1 MiB\) live in host "
                     r"memory, 3\.1 MiB in all, more than max_memory\['cpu'\] \(2\.0 MiB\)"),
])
def test_a_cpu_cap_too_small_is_refused_before_any_expert_is_read(tiny_path, store, cap, message, monkeypatch):
    from oled_hf.offload import store as store_module

    monkeypatch.setattr(store_module.ExpertStore, "from_safetensors", lambda *a, **k: pytest.fail("store built"))
    with pytest.raises(ValueError, match=message):
        OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, offload_config=OffloadConfig(cache_size=4, store=store),
                                                 max_memory={"cpu": cap})


def on_cuda(model):
    """The offloaded model as the resolution sees it, placed on cuda:0 (its sizes are the CPU model's)."""
    return SimpleNamespace(config=model.config, device=torch.device("cuda:0"), parameters=model.parameters,
                           buffers=model.buffers, moe_blocks=model.moe_blocks)


def test_the_device_entry_leaves_the_pool_what_the_weights_do_not_take(offloaded):
    model, weights = on_cuda(offloaded), non_expert_bytes(offloaded)
    assert 1.95 * MIB <= weights < 2.05 * MIB  # "2.0 MiB" in the messages below
    resolved = max_memory_module.resolve_max_memory(OffloadConfig(max_memory={0: weights + 60 * EXPERT}), model, None)
    assert resolved.max_gpu_memory == 60 * EXPERT and resolved.max_memory is None
    assert resolved.resolve_slots(3, 32, expert_bytes=EXPERT) == 60
    capped = OffloadConfig(cache_size=20, max_memory={"cuda:0": weights + 60 * EXPERT})  # 20 x 3 slots: they fit
    assert max_memory_module.resolve_max_memory(capped, model, None).cache_size == 20
    over = OffloadConfig(cache_size=21, max_memory={0: weights + 60 * EXPERT})  # 63 slots: 5.9 MiB
    with pytest.raises(ValueError, match=r"^cache_size=21 needs 5\.9 MiB for the expert cache and the non-expert "
                                         r"weights take 2\.0 MiB: 7\.9 MiB in all, more than max_memory's cuda:0 "
                                         r"entry \(7\.6 MiB\); lower the budget, raise the entry"):
        max_memory_module.resolve_max_memory(over, model, None)
    with pytest.raises(ValueError, match=r"leaves 96\.0 KiB for the expert cache after the non-expert weights "
                                         r"\(2\.0 MiB\), less than its minimum: min_slots_per_layer=1 x 3 MoE layers "
                                         r"x 96\.0 KiB = 288\.0 KiB; raise the entry"):
        max_memory_module.resolve_max_memory(OffloadConfig(max_memory={0: weights + EXPERT}), model, None)
    with pytest.raises(ValueError, match=r"max_memory's cuda:1 entry \(1\.0 GiB\) names a device the model is not on: "
                                         r"device_map put the non-expert weights on cuda:0"):
        max_memory_module.resolve_max_memory(OffloadConfig(max_memory={1: "1GiB"}), model, None)


def test_a_device_entry_on_a_cpu_load_is_refused(tiny_path):
    with pytest.raises(ValueError, match=r"max_memory's cuda:0 entry \(20\.0 GiB\) names a device the model is not "
                                         r"on: device_map put the non-expert weights on cpu"):
        OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, offload_config={}, max_memory={0: "20GiB"})
