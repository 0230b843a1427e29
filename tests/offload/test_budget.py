"""Budgets sized for the user: cache_ratio="auto" from (mocked) free device memory, max_gpu_memory in bytes."""

from types import SimpleNamespace

import pytest
import torch
from oled_hf.modeling import OledLLaDA2ForDiffusionLM

from oled_hf.offload import budget
from oled_hf.offload.config import OffloadConfig

MIB = 2**20
# the tiny checkpoint's shape (tests/conftest.py tiny_path): 4 layers, 3 of them MoE with 32 experts
TINY = SimpleNamespace(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                       intermediate_size=256, moe_intermediate_size=64, num_experts_per_tok=4, num_shared_experts=1,
                       num_experts=32, num_hidden_layers=4, num_moe_layers=3, vocab_size=512,
                       max_position_embeddings=4096, _attn_implementation="sdpa")
ONE = 3 * 128 * 64 * 4  # one float32 expert: 98304 bytes
TINY_ACTIVATIONS = 45_744_128  # B=1, S=4096, float32 (worked out in test_activation_bytes)


def test_activation_bytes():
    # KV 2*4*1*4096*2*32*4 = 8,388,608; per token 4*(4*128 + (4+4)*32 + max(512, 4*(192+128) + 192)) + 4*32
    # = 9088, times 4096 = 37,224,448; logits 2*1*32*512*4 = 131,072
    assert budget.activation_bytes(TINY, 1, 4096, 4) == 8_388_608 + 37_224_448 + 131_072 == TINY_ACTIVATIONS
    assert budget.activation_bytes(TINY, 2, 4096, 4) == 2 * TINY_ACTIVATIONS
    assert budget.activation_bytes(TINY, 1, 100, 4) == 204_800 + 908_800 + 131_072
    eager = SimpleNamespace(**{**vars(TINY), "_attn_implementation": "eager"})
    assert budget.activation_bytes(eager, 1, 4096, 4) == TINY_ACTIVATIONS + 4 * 4096 * 4096 * 4  # the S x S scores


def _auto(free, total=100 * MIB, reclaimable=0, activations=TINY_ACTIVATIONS, **kw):
    return budget.auto_slots(free_bytes=free, total_bytes=total, reclaimable_bytes=reclaimable,
                             activations=activations, one_expert_bytes=ONE, num_layers=3, num_experts=32,
                             min_slots_per_layer=kw.pop("min_slots", 1), device="cuda:0", **kw)


def test_auto_slots_is_free_memory_less_headroom_and_activations_in_whole_experts():
    # 60 MiB free of 100: keep 10 MiB (10%), 43.6 MiB activations -> 6,684,672 bytes = 68 experts exactly
    assert _auto(60 * MIB) == (60 * MIB - 10 * MIB - TINY_ACTIVATIONS) // ONE == 68
    assert _auto(60 * MIB - 1) == 67
    assert _auto(55 * MIB, reclaimable=5 * MIB) == 68  # PyTorch's cached, unused memory is reused
    assert _auto(70 * MIB, gpu_memory_utilization=0.8) == 68  # 20% kept free: 10 MiB more needed for the same
    assert _auto(80 * 2**30, total=141 * 2**30) == 96  # everything fits: all experts, no more


def test_auto_slots_refuses_when_the_minimum_does_not_fit():
    with pytest.raises(ValueError) as err:
        _auto(50 * MIB)
    assert str(err.value) == (
        "cache_ratio='auto': cuda:0 has 50.0 MiB free of 100.0 MiB, but the smallest expert cache "
        "(min_slots_per_layer=1 x 3 MoE layers = 3 slots of 96.0 KiB) plus activations and KV (43.6 MiB) plus "
        "headroom (10% of the device, 10.0 MiB) needs 53.9 MiB; free device memory, lower auto_batch_size / "
        "auto_context_length, raise gpu_memory_utilization, or give a fixed budget (cache_size=N or "
        "max_gpu_memory='...')"
    )
    assert _auto(60 * MIB, min_slots=22) == 68  # 66 needed, 68 fit
    with pytest.raises(ValueError, match="min_slots_per_layer=23 x 3 MoE layers = 69 slots"):
        _auto(60 * MIB, min_slots=23)


def test_auto_refuses_without_cuda():
    with pytest.raises(ValueError, match=r"cache_ratio='auto' needs a CUDA device .* but the model is on cpu.*; "
                                         r"give cache_ratio=R .*, cache_size=N .* or max_gpu_memory='...'"):
        budget.device_memory("cpu")


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda answering as a device with ``state['free']`` of 100 MiB free, 8 MiB reserved, 2 MiB allocated."""
    state = {"free": 60 * MIB, "asked": []}

    def mem_get_info(device=None):
        state["asked"].append(device)
        return state["free"], 100 * MIB

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 8 * MIB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 2 * MIB)
    return state


def test_device_memory_reads_the_device_and_its_reusable_cache(fake_cuda):
    assert budget.device_memory("cuda:1") == (60 * MIB, 100 * MIB, 6 * MIB)
    assert fake_cuda["asked"] == [torch.device("cuda:1")]


def test_resolve_device_slots_with_a_mocked_device(fake_cuda):
    fake_cuda["free"] = 54 * MIB  # + 6 MiB reusable = the 60 MiB of the pure test
    assert OffloadConfig(cache_ratio="auto").resolve_device_slots(TINY, 4, "cuda:0") == 68
    # a shorter context reserves less: 100 tokens -> 1,244,672 bytes of activations
    assert OffloadConfig(cache_ratio="auto", auto_context_length=100).resolve_device_slots(TINY, 4, "cuda:0") == 96
    assert OffloadConfig(max_gpu_memory="5MiB").resolve_device_slots(TINY, 4, "cuda:0") == 53
    fake_cuda["free"] = 0  # only the 6 MiB PyTorch holds unused
    assert OffloadConfig(max_gpu_memory="5MiB").resolve_device_slots(TINY, 4, "cuda:0") == 53  # 4.97 MiB fits
    with pytest.raises(ValueError) as err:
        OffloadConfig(max_gpu_memory="8MiB").resolve_device_slots(TINY, 4, "cuda:0")
    assert str(err.value) == ("max_gpu_memory='8MiB' needs 8.0 MiB of device memory for 85 expert slots, but cuda:0 "
                              "has 6.0 MiB free of 100.0 MiB; use a smaller budget or cache_ratio='auto'")
    with pytest.raises(ValueError, match=r"cache_size=32 needs 9.0 MiB of device memory for 96 expert slots"):
        OffloadConfig(cache_size=32).resolve_device_slots(TINY, 4, "cuda:0")
    with pytest.raises(ValueError, match=r"cache_ratio='auto': cuda:0 has 6.0 MiB free of 100.0 MiB"):
        OffloadConfig(cache_ratio="auto").resolve_device_slots(TINY, 4, "cuda:0")


# ---- through from_pretrained (CPU; the device query mocked where a device is needed) --------------------------

def _ids():
    return torch.randint(0, 500, (1, 20), generator=torch.Generator().manual_seed(3))


def test_auto_on_cpu_refuses_before_reading_experts(tiny_path, monkeypatch):
    from oled_hf.offload import runtime

    def read(*args, **kwargs):
        raise AssertionError("the store read experts before the budget was checked")

    monkeypatch.setattr(runtime.ExpertStore, "from_safetensors", read)
    with pytest.raises(ValueError, match=r"cache_ratio='auto' needs a CUDA device .* the model is on cpu"):
        OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, offload_config=OffloadConfig(cache_ratio="auto"))


def test_auto_through_from_pretrained_sizes_the_pool_from_the_device(tiny_path, tiny_model, monkeypatch):
    asked = []

    def device_memory(device):
        asked.append(str(device))
        return 60 * MIB, 100 * MIB, 0

    monkeypatch.setattr(budget, "device_memory", device_memory)
    model = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, offload_config=OffloadConfig(cache_ratio="auto")).eval()
    assert asked == ["cpu"]
    stats = model.offload_stats()
    assert stats["total_slots"] == 68 and stats["pool_bytes"] == 68 * ONE
    ids = _ids()
    assert torch.equal(model.generate(ids, max_new_tokens=16, block_length=8),
                       tiny_model.generate(ids, max_new_tokens=16, block_length=8))


def test_max_gpu_memory_through_from_pretrained(tiny_path, tiny_model):
    model = OledLLaDA2ForDiffusionLM.from_pretrained(
        tiny_path, offload_config=OffloadConfig(max_gpu_memory="1MiB")).eval()
    stats = model.offload_stats()
    assert stats["total_slots"] == MIB // ONE == 10 and stats["pool_bytes"] <= MIB
    ids = _ids()
    assert torch.equal(model.generate(ids, max_new_tokens=16, block_length=8),
                       tiny_model.generate(ids, max_new_tokens=16, block_length=8))
