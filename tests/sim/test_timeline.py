"""The cost model's shape: grouped resident reference, timeline overlap, prefetch accounting."""

import numpy as np
import pytest

from oled_hf.offload.costmodel import CostModel
from oled_hf.sim.replay import compare, replay
from oled_hf.sim.synthetic import synthetic_trace
from oled_hf.sim.timeline import Timeline

GROUPED = CostModel.h200_pcie5(2048, 512, kernel="grouped")


def test_fused_reference_is_one_launch_plus_bytes_plus_flops():
    counts = np.zeros(256, dtype=np.int64)
    counts[[3, 7, 9]] = [2, 1, 5]
    cm = GROUPED
    expert_bytes = 3 * 2048 * 512 * 2
    read = expert_bytes / 4.8e12
    per_token = 2 * 3 * 2048 * 512 / (989e12 * 0.15)
    assert cm.expert_bytes == expert_bytes
    assert cm.fused_layer_time(counts) == pytest.approx(10e-6 + 3 * read + 8 * per_token)
    assert cm.loop_layer_time(counts) == pytest.approx(3 * (10e-6 + read) + 8 * per_token)
    assert cm.fused_layer_time(np.zeros(256)) == 0.0
    # the grouped live kernel: one launch per layer access, each expert only its HBM read
    assert cm.kernel == "grouped" and cm.gpu_layer_fixed_s == pytest.approx(10e-6)
    assert cm.gpu_expert_fixed_s == pytest.approx(read)
    loop = CostModel.h200_pcie5(2048, 512)
    assert loop.kernel == "loop" and loop.gpu_expert_fixed_s == pytest.approx(10e-6 + read)
    with pytest.raises(ValueError, match="kernel='fused'"):
        CostModel.h200_pcie5(2048, 512, kernel="fused")


def test_early_prefetch_lands_before_its_layer_and_late_one_is_exposed():
    copy = 100e-6
    tl = Timeline(copy)
    land = tl.copies(1, 0.0)[0]  # issued at t=0: lands at 100 us
    assert land == pytest.approx(copy)
    start, ready = tl.begin_layer(nonexpert_s=150e-6, planner_s=10e-6)  # plan at 160 us
    lt = tl.end_layer(start, ready, 10e-6, np.array([land]), np.array([5e-6]), 0.0)
    assert lt.exposed_copy_s == 0.0 and lt.end == pytest.approx(160e-6 + 10e-6 + 5e-6)
    # a copy issued at the plan of the next layer lands after the kernel could start: exposed
    start, ready = tl.begin_layer(nonexpert_s=0.0, planner_s=0.0)
    late = tl.copies(1, ready)[0]
    lt = tl.end_layer(start, ready, 10e-6, np.array([late]), np.array([5e-6]), 0.0)
    assert lt.exposed_copy_s == pytest.approx(copy - 10e-6)
    assert lt.end == pytest.approx(late + 5e-6)
    # FIFO: copies queue behind each other on the one engine
    a = tl.copies(2, 0.0)
    assert a[0] == pytest.approx(tl.copy_free - copy) and a[1] - a[0] == pytest.approx(copy)


def test_cpu_runs_concurrently_and_the_layer_waits_for_both():
    tl = Timeline(1e-3)
    start, ready = tl.begin_layer(0.0, 0.0)
    lt = tl.end_layer(start, ready, 0.0, np.zeros(1), np.array([20e-6]), 50e-6)
    assert lt.end == pytest.approx(50e-6) and lt.exposed_copy_s == 0.0


@pytest.fixture(scope="module")
def trace():
    return synthetic_trace(num_layers=4, num_experts=32, top_k=4, block_length=8, num_blocks=3, batch=1,
                           num_sequences=2, seed=3)


@pytest.mark.parametrize("warmup", [0, 1])
@pytest.mark.parametrize("policy", ["prefetch", "moe-infinity"])
def test_prefetch_bytes_issued_equal_used_plus_wasted(trace, policy, warmup):
    """Also after a warm-up sequence: a warm-up prefetch hit in the timed part counts as neither."""
    r = replay(trace, policy, 8, layer_adaptive=False, cpu_compute="off", cost_model=GROUPED, planner_s=0.0,
               check_invariants=True, warmup_sequences=warmup)
    assert r.prefetch_issued > 0 and r.prefetch_used > 0
    assert r.prefetch_issued == r.prefetch_used + r.prefetch_wasted
    assert r.copies * r.expert_bytes == r.bytes_copied and r.copies >= r.prefetch_issued


def test_previous_prefetch_copies_into_idle_time_without_predicted_routes():
    """``previous`` needs no version-2 trace; every prefetch it issues is a copy (the cache lacked the expert), each
    started before its layer plans, and the books balance."""
    v1 = synthetic_trace(num_layers=4, num_experts=32, top_k=4, block_length=8, num_blocks=3, num_sequences=2,
                         seed=3, predict_keep=None)
    from oled_hf.offload.system import parse_system

    r = replay(v1, "lru+previous", 8, system=parse_system("lru+previous+cpu+reuse+adaptive"), cost_model=GROUPED,
               planner_s=0.0, check_invariants=True)
    assert r.prefetch_issued > 0 and r.prefetch_used > 0
    assert r.prefetch_issued == r.prefetch_used + r.prefetch_wasted


def test_offloading_never_beats_fused_residency(trace):
    results = compare(trace, ["oled", "lru", "lfu", "static", "tide", "prefetch", "moe-infinity"], [4, 16, 32],
                      layer_adaptive=False, cost_model=GROUPED, planner_s=0.0, bounds=False)
    assert len(results) == 21
    for r in results:
        assert r.ratio_to_full >= 1.0, (r.policy, r.cache_size, r.ratio_to_full)
        assert r.loop_time_s > r.full_time_s


def test_planner_time_enters_tpot(trace):
    a = replay(trace, "lru", 8, cost_model=GROUPED, planner_s=0.0)
    b = replay(trace, "lru", 8, cost_model=GROUPED, planner_s=100e-6)
    assert b.planner_time_s == pytest.approx(100e-6 * a.layer_accesses)
    assert b.sim_time_s - a.sim_time_s >= 0.5 * b.planner_time_s


def test_version_1_trace_replays_without_the_prefetch_baseline():
    v1 = synthetic_trace(num_layers=3, num_experts=16, top_k=2, block_length=4, num_blocks=2, predict_keep=None)
    v2 = synthetic_trace(num_layers=3, num_experts=16, top_k=2, block_length=4, num_blocks=2)
    assert v1.version == 1 and not v1.has_predictions and v2.version == 2 and v2.has_predictions
    assert np.array_equal(v1.arrays["topk_ids"], v2.arrays["topk_ids"])  # predictions do not change routes
    assert (v2.arrays["pred_ids"][0] == -1).all() and (v2.arrays["pred_ids"][1:] >= 0).all()
    with pytest.raises(ValueError, match="needs predicted routes"):
        replay(v1, "prefetch", 4, cost_model=GROUPED, planner_s=0.0)
    names = [r.policy for r in compare(v1, ["lru", "prefetch", "moe-infinity"], [4], cost_model=GROUPED,
                                       planner_s=0.0, bounds=False)]
    assert names == ["lru", "moe-infinity"]


def test_warmup_sequences_are_left_out_of_counts_and_time():
    t = synthetic_trace(num_layers=3, num_experts=16, top_k=2, block_length=4, num_blocks=2, num_sequences=3, seed=5)
    cold = replay(t, "lru", 16, layer_adaptive=False, cpu_compute="off", cost_model=GROUPED, planner_s=0.0)
    warm = replay(t, "lru", 16, layer_adaptive=False, cpu_compute="off", cost_model=GROUPED, planner_s=0.0,
                  warmup_sequences=1)
    assert warm.forwards < cold.forwards and 0 < warm.output_tokens < cold.output_tokens
    assert warm.misses < cold.misses and warm.ratio_to_full < cold.ratio_to_full
    assert warm.ratio_to_full >= 1.0
    with pytest.raises(ValueError, match="leaves nothing to time"):
        replay(t, "lru", 16, cost_model=GROUPED, planner_s=0.0, warmup_sequences=3)
