"""Layers that hold every expert run without a routing sync; planned afterwards, to the same plans."""

import numpy as np
import pytest
import torch
from oled_hf.modeling import OledLLaDA2ForDiffusionLM

from oled_hf import OffloadConfig
from oled_hf.offload import executor as executor_module
from tests.systems import system_for

PROMPT = torch.tensor([[5, 17, 42, 99, 3, 250, 7, 64, 11, 300, 2, 8, 77, 120, 33, 6, 401, 19]])
GEN = dict(max_new_tokens=24, block_length=8, threshold=0.9)


@pytest.fixture(scope="module")
def reference(tiny_model):
    return tiny_model.generate(PROMPT, **GEN)


def _model(path, layers_full=(), **kwargs):
    """An offloaded model whose ``layers_full`` hold every expert (one synthetic access each), stats reset.

    The tiny router never picks some experts, so a generate alone does not fill a layer.
    """
    model = OledLLaDA2ForDiffusionLM.from_pretrained(path, offload_config=OffloadConfig(**kwargs)).eval()
    rt, cfg = model._offload_runtime, model.config
    ids = torch.arange(cfg.num_experts).reshape(-1, cfg.num_experts_per_tok)
    x = torch.randn(ids.shape[0], cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    weights = torch.full(ids.shape, 1.0 / ids.shape[1])
    with torch.no_grad():
        for layer in layers_full:
            rt.executors[layer](model.moe_blocks()[layer], x, ids, weights)
            assert rt.controller.holds_all(layer)
    rt.reset_stats()
    return model


def _log_controller(model):
    """Record every plan (clock, layer, routing) and policy event the controller makes, in order."""
    ctrl, log = model._offload_runtime.controller, []
    plan = ctrl._plan

    def logged_plan(layer, ids, weights):
        log.append(("plan", ctrl.clock, layer, np.asarray(ids).tolist(),
                    None if weights is None else np.asarray(weights).tolist()))
        return plan(layer, ids, weights)

    ctrl._plan = logged_plan
    for hook in ("on_block_start", "on_iteration", "on_block_end"):
        fn = getattr(ctrl.policy, hook)
        setattr(ctrl.policy, hook, lambda *a, _fn=fn, _hook=hook: (log.append((_hook, ctrl.clock)), _fn(*a))[1])
    return log


def _counters(stats):
    drop = lambda row: {k: v for k, v in row.items()  # noqa: E731
                        if not k.endswith("_seconds") and not k.startswith("host_syncs")}
    return drop(stats["total"]), [drop(row) for row in stats["layers"]]


@pytest.mark.parametrize("policy", ["oled", "lru", "tide"])  # oled reads gate weights, lru and tide do not
def test_deferred_plans_equal_immediate_plans(tiny_path, reference, policy):
    """Layers 0 and 2 full, layer 1 not: deferred and planned accesses interleave in one forward."""
    runs = {}
    for defer in (True, False):
        model = _model(tiny_path, (0, 2), cache_size=32, system=system_for(policy))
        rt = model._offload_runtime
        rt.defer_routing = defer
        log = _log_controller(model)
        assert torch.equal(model.generate(PROMPT, **GEN), reference), (policy, defer)
        stats = model.offload_stats()
        runs[defer] = (log, _counters(stats), rt.routing_transfers.tolist(), stats["total"]["forwards"],
                       [row["host_syncs"] for row in stats["layers"]])
    (log, counters, transfers, forwards, syncs), (log0, counters0, transfers0, forwards0, syncs0) = \
        runs[True], runs[False]
    assert log == log0 and counters == counters0 and forwards == forwards0
    assert transfers0 == [forwards] * 3  # planned at once: one routing sync per layer access
    assert transfers[0] == transfers[2] == 0 and transfers[1] > 0
    assert syncs0 == transfers0 and syncs == transfers  # the host syncs are the routing reads, nothing else


def test_full_cache_logits_bit_identical_and_no_routing_sync(tiny_path, tiny_model):
    ids = torch.randint(0, 500, (2, 24), generator=torch.Generator().manual_seed(0))
    model = _model(tiny_path, (0, 1, 2), cache_size=32)
    rt = model._offload_runtime
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(model(ids, block_length=8).logits, tiny_model(ids, block_length=8).logits)
    assert rt.routing_transfers.tolist() == [0, 0, 0]
    total = model.offload_stats()["total"]
    assert total["hits"] > 0 and total["misses"] == 0 and total["forwards"] == 2


def test_partial_cache_syncs_once_per_layer(tiny_path, reference):
    model = _model(tiny_path, cache_size=13, system="oled-uniform")  # ~40%: no layer can hold every expert
    assert torch.equal(model.generate(PROMPT, **GEN), reference)
    rt = model._offload_runtime
    assert rt.routing_transfers.tolist() == [model.offload_stats()["total"]["forwards"]] * 3


def test_without_grouped_kernel_full_layers_take_the_loop_path(tiny_path, reference, monkeypatch):
    model = _model(tiny_path, (0, 1, 2), cache_size=32)
    monkeypatch.setattr(executor_module, "grouped_supported", lambda device_type, dtype: False)
    assert torch.equal(model.generate(PROMPT, **GEN), reference)
    rt = model._offload_runtime
    assert rt.routing_transfers.tolist() == [model.offload_stats()["total"]["forwards"]] * 3


def test_slot_maps_follow_the_slots(tiny_path):
    """A full layer's map is built once, dropped by a planned access of the layer or a rebalance."""
    model = _model(tiny_path, (0,), cache_size=32)
    rt = model._offload_runtime
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    with torch.no_grad():
        model(ids)
    slot_map = rt.executors[0].slot_map
    slot_of = rt.controller.state.resident(0)
    assert slot_map is not None and rt.executors[1].slot_map is None
    assert all(int(slot_map.keys[e]) + slot_map.lo == s for e, s in slot_of.items())
    with torch.no_grad():
        model(ids)
    assert rt.executors[0].slot_map is slot_map
    rt.controller.last_moves = [None]  # as if the block end moved slots
    rt.controller.on_block_end = lambda *a: None
    rt.on_block_end(0, ids)
    assert rt.executors[0].slot_map is None

