"""Replay: determinism, trace round trip, equality with a live-style controller loop, table."""

import numpy as np
import pytest
import torch

from oled_hf.offload.config import OffloadConfig
from oled_hf.offload.controller import CacheController
from oled_hf.offload.costmodel import CostModel
from oled_hf.offload.trace import OP_FORWARD, TraceWriter, load_trace
from oled_hf.sim.replay import compare, format_table, replay
from oled_hf.sim.synthetic import synthetic_trace
from tests.systems import system_for

CM = CostModel.h200_pcie5(2048, 512)


@pytest.fixture(scope="module")
def trace():
    return synthetic_trace(num_layers=3, num_experts=32, top_k=4, block_length=8, num_blocks=3, batch=2,
                           num_sequences=2, seed=1)


def test_replay_is_deterministic(trace):
    a = replay(trace, "oled", 6, cost_model=CM, planner_s=20e-6)
    b = replay(trace, "oled", 6, cost_model=CM, planner_s=20e-6)
    assert a.to_dict() == b.to_dict()
    assert a.hits + a.misses > 0 and a.output_tokens == 2 * 2 * 3 * 8


def test_trace_round_trip(trace, tmp_path):
    path = tmp_path / "t.pt"
    trace.save(str(path))
    back = load_trace(str(path))
    assert back.header == trace.header
    assert set(back.arrays) == set(trace.arrays)
    for k, v in trace.arrays.items():
        assert np.array_equal(back.arrays[k], v), k
    a = replay(back, "lru", 5, cost_model=CM, planner_s=0.0)
    assert a.to_dict() == replay(trace, "lru", 5, cost_model=CM, planner_s=0.0).to_dict()
    ev = back.event(0)
    assert ev.masked.shape == (2, 8) and ev.confidence.dtype == torch.float32 and ev.token_ids.dtype == torch.long
    rec = back.forward(0)
    assert rec.kind == "prefill" and rec.topk_ids.shape[0] == 3


def test_load_trace_errors(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a trace")
    with pytest.raises(ValueError, match="not a readable oled-trace file"):
        load_trace(str(bad))
    torch.save({"format": "other"}, str(tmp_path / "other.pt"))
    with pytest.raises(ValueError, match="not an oled-trace file"):
        load_trace(str(tmp_path / "other.pt"))


def test_writer_layer_by_layer_matches_add_forward():
    ids = [np.array([[0, 1], [2, 3]]), np.array([[4, 5], [6, 7]])]
    w = [np.full((2, 2), 0.5, dtype=np.float32)] * 2
    a, b = TraceWriter(2, 8, 2, 2), TraceWriter(2, 8, 2, 2)
    a.add_forward("denoise", 0, 0, ids, w)
    b.begin_forward("denoise", 0, 0)
    for layer in (1, 0):
        b.add_layer(layer, torch.from_numpy(ids[layer]), torch.from_numpy(w[layer]))
    b.end_forward()
    ta, tb = a.trace(), b.trace()
    assert all(np.array_equal(ta.arrays[k], tb.arrays[k]) for k in ta.arrays)
    with pytest.raises(ValueError, match="kind='decode' is unknown"):
        a.add_forward("decode", 0, 0, ids, w)


@pytest.mark.parametrize("policy", ["oled", "tide", "static"])
def test_replay_equals_live_controller_sequence(trace, policy):
    """What the live runtime does (controller calls in forward/event order) is what replay counts."""
    cfg = OffloadConfig(cache_size=6, system=system_for(policy))
    ctrl = CacheController(cfg, trace.num_layers, trace.num_experts, CM)
    for op, idx in trace.ops():
        if op == OP_FORWARD:
            ctrl.begin_forward()
            rec = trace.forward(idx)
            for layer in range(trace.num_layers):
                ctrl.plan(layer, torch.from_numpy(rec.topk_ids[layer].astype(np.int64)),
                          torch.from_numpy(rec.topk_weights[layer].astype(np.float32)))
        else:
            trace.deliver(ctrl, op, idx)
    r = replay(trace, policy, 6, cost_model=CM)
    assert (r.hits, r.misses, r.copies, r.evictions, r.cpu_expert_tokens) == (
        ctrl.stats.total("hits"), ctrl.stats.total("misses"), ctrl.stats.total("copies"),
        ctrl.stats.total("evictions"), ctrl.stats.total("cpu_expert_tokens"))
    assert r.capacities == ctrl.capacities


def test_times_and_table(trace):
    off = replay(trace, "lru", 4, cpu_compute="off", cost_model=CM, check_invariants=True)
    assert off.ratio_to_full >= 1.0 and off.cpu_expert_tokens == 0
    full = replay(trace, "lru", 32, layer_adaptive=False, cpu_compute="off", cost_model=CM)
    assert full.misses == full.copies  # only cold misses remain at full capacity
    results = compare(trace, ["oled", "lru"], [4, 8], layer_adaptive=False, cost_model=CM)
    table = format_table(results)
    assert "policy" in table and "hit/MIN %" in table and table.count("\n") >= 6
    assert all(r.bound_hit_rate and r.hit_rate <= r.bound_hit_rate + 1e-12 for r in results)
    with pytest.raises(ValueError, match="needs cache_size"):
        replay(trace, "lru", None)
    with pytest.raises(ValueError, match="policy='x' is unknown"):
        replay(trace, "x", 4)


def test_throughput_sanity():
    """200k routing entries replay (speed is reported by eval/replay_speed.py, not asserted)."""
    tr = synthetic_trace(num_layers=4, num_experts=128, top_k=8, block_length=32, num_blocks=14, seed=0)
    assert tr.routing_entries >= 200_000
    r = replay(tr, "oled", 32, cost_model=CM)
    assert r.layer_accesses == tr.num_forwards * 4


def test_replay_budget_overrides_a_max_gpu_memory_config(trace):
    """A recorded config budgeted in bytes replays at an explicit cache_size (was: 'got both')."""
    recorded = OffloadConfig(max_gpu_memory="1GiB", system="lru+cpu+adaptive", cpu_compute="off")
    r = replay(trace, "lru", 4, cpu_compute="off", offload_config=recorded, cost_model=CM, planner_s=0.0)
    plain = replay(trace, "lru", 4, cpu_compute="off", cost_model=CM, planner_s=0.0)
    assert r.cache_size == 4 and r.to_dict() == plain.to_dict()
    ratio = OffloadConfig(cache_ratio=0.5)
    assert replay(trace, "lru", 4, offload_config=ratio, cost_model=CM, planner_s=0.0).cache_size == 4


def test_copy_only_uniform_runs_are_measured_against_demand_min(trace):
    """Every miss copied: MIN+bypass is out of reach, so the ceiling is demand MIN (bypass=False)."""
    from oled_hf.sim.belady import belady_global, belady_min
    from oled_hf.sim.replay import compare_systems

    demand, bypass = belady_min(trace, 16, bypass=False), belady_min(trace, 16)
    assert demand.hit_rate < bypass.hit_rate  # the two differ on this trace: the choice matters
    off = compare(trace, ["lru", "lfu"], [16], layer_adaptive=False, cpu_compute="off", cost_model=CM)
    on = compare(trace, ["lru"], [16], layer_adaptive=False, cpu_compute="on", cost_model=CM)
    assert {(r.bound_name, r.bound_hit_rate) for r in off} == {("MIN", demand.hit_rate)}
    assert all(r.hit_rate <= r.bound_hit_rate + 1e-12 for r in off)
    assert (on[0].bound_name, on[0].bound_hit_rate) == ("MIN+bypass", bypass.hit_rate)
    rows = compare_systems(trace, ["lru", "lru+cpu", "lru+adaptive"], [16], cost_model=CM, planner_s=0.0)
    assert [r.bound_name for r in rows] == ["MIN", "MIN+bypass", "global MIN+bypass"]
    assert rows[2].bound_hit_rate == belady_global(trace, 16 * trace.num_layers).hit_rate
    table = format_table(rows)
    assert "hit/MIN %" in table and "  MIN: demand MIN (per layer, every miss admitted)" in table
    assert "  MIN+bypass: per-layer MIN with bypass" in table and "  global MIN+bypass: MIN with bypass" in table


def test_a_capped_prefetch_window_ends_when_the_next_layer_has_planned():
    """A capped prefetcher may copy until the next layer's demand copies start: after that layer's non-expert
    part and its planner time. With a planner as slow as four copies the window holds more copies: 42
    prefetches instead of 5 here (the window used to leave the planner out: 5 at any planner time)."""
    from oled_hf.offload.costmodel import CostModel
    from oled_hf.offload.system import parse_system
    from oled_hf.sim.synthetic import synthetic_trace

    trace = synthetic_trace(num_layers=4, num_experts=64, top_k=4, block_length=16, num_blocks=3, seed=4)
    cm = CostModel.h200_pcie5(2048, 512)
    system = parse_system("lru+gate-capped+copy+uniform").with_knobs(prefetch__limit=64)
    issued = {p: replay(trace, "promoe", 12, system=system, cost_model=cm, planner_s=p).prefetch_issued
              for p in (0.0, 4 * cm.copy_time())}
    assert issued[4 * cm.copy_time()] >= issued[0.0] + 30
