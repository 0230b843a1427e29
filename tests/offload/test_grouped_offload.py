"""Grouped execution over the slot pool and the host store: bit-identical to residency on one device."""

import numpy as np
import pytest
import torch
from oled_hf.modeling import OledLLaDA2ForDiffusionLM
from oled_hf.modeling.experts import LOOP_EXECUTOR

from oled_hf import OffloadConfig
from oled_hf.offload.executor import pack_routing, plan_waves, unpack_routing
from oled_hf.offload.layer_plan import LayerPlan
from tests.systems import system_for

POLICIES = ["oled", "lru", "lfu", "static", "tide"]
# Copies so slow and the CPU so fast that the dispatcher sends misses to the CPU.
CPU_HEAVY = dict(h2d_bandwidth_gbps=1e-4, cpu_expert_ms_per_token=1e-6, calibrate=False, cpu_compute="on")


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 500, (2, 24), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def resident_logits(tiny_model, ids):
    with torch.no_grad():
        return tiny_model(ids, block_length=8).logits


def _logits(path, ids, **kwargs):
    model = OledLLaDA2ForDiffusionLM.from_pretrained(path, offload_config=OffloadConfig(**kwargs)).eval()
    with torch.no_grad():
        for _ in range(2):  # the second forward runs with a warm cache (hits, evictions)
            logits = model(ids, block_length=8).logits
    return logits, model.offload_stats()["total"]


@pytest.mark.parametrize("policy", POLICIES)
def test_logits_bit_identical_for_every_policy_and_cache_size(tiny_path, ids, resident_logits, policy):
    for cache_size in (1, 8, 32):  # 1 slot: the request streams through the slot, several waves
        for extra in ({"cpu_compute": "off"}, CPU_HEAVY):
            logits, total = _logits(tiny_path, ids, cache_size=cache_size, system=system_for(policy), **extra)
            assert torch.equal(logits, resident_logits), (policy, cache_size, extra)
            if extra is CPU_HEAVY and cache_size < 32:
                assert total["cpu_expert_tokens"] > 0


def test_cpu_misses_grouped_and_loop_paths_agree(tiny_path, ids, resident_logits):
    # pinned: one grouped call over the aligned layer buffer, bit-identical; mmap: the per-expert
    # loop over 8-byte-aligned file views, which may round differently (see store.py)
    for store in ("pinned", "mmap"):
        logits, total = _logits(tiny_path, ids, cache_size=4, store=store, **CPU_HEAVY)
        assert total["cpu_expert_tokens"] > 0
        if store == "pinned":
            assert torch.equal(logits, resident_logits)
        else:
            torch.testing.assert_close(logits, resident_logits, rtol=0, atol=1e-4)


def test_resident_loop_reference_gives_the_same_logits(tiny_path, ids, resident_logits):
    model = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path).eval()
    for block in model.moe_blocks():
        block.experts_executor = LOOP_EXECUTOR
    with torch.no_grad():
        assert torch.equal(model(ids, block_length=8).logits, resident_logits)


def test_plan_waves_split_only_where_a_slot_is_reused():
    plan = LayerPlan(hits=[2, 7], copies=[(1, 10, None), (4, 11, 3)], cpu=[], slot_of={2: 5, 7: 6, 1: 10, 4: 11})
    waves = plan_waves(plan)
    assert [(w.experts.tolist(), w.slots.tolist(), w.copies) for w in waves] == [
        ([2, 7], [5, 6], False), ([1, 4], [10, 11], True)]
    streamed = LayerPlan(hits=[2], copies=[(1, 6, None), (4, 5, 2), (9, 6, 1)], cpu=[], slot_of={2: 5})
    assert [(w.experts.tolist(), w.slots.tolist()) for w in plan_waves(streamed)] == [
        ([2], [5]), ([1, 4], [6, 5]), ([9], [6])]


def test_routing_packs_into_one_transfer_losslessly():
    topk_ids = torch.tensor([[3, 250], [7, 0]])
    w = torch.tensor([[0.25, -1.5e-8], [float("inf"), 2.5]])
    ids_np, w_np = unpack_routing(pack_routing(topk_ids, w).numpy(), 2)
    assert np.array_equal(ids_np, topk_ids.numpy()) and np.array_equal(w_np, w.numpy())
