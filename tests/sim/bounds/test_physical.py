"""The physical bound (oled_hf/sim/bounds/physical.py) on a hand-checked trace, and against replay."""

import numpy as np
import pytest

from oled_hf.offload.costmodel import CostModel
from oled_hf.sim.belady import global_min
from oled_hf.sim.bounds.physical import access_bound_s, bound_from_counts, physical_bound
from oled_hf.sim.replay import replay
from oled_hf.sim.synthetic import synthetic_trace

# copy 1 us; CPU max(2 us, n x 1 us); GPU: launch 1 us, weight read 1 us, 0.1 us per token; non-expert 0.5 us
CM = CostModel(expert_bytes=1000, h2d_bytes_per_s=1e9, gpu_expert_fixed_s=1e-6, gpu_s_per_token=0.1e-6,
               cpu_expert_fixed_s=2e-6, cpu_s_per_token=1e-6, nonexpert_s_per_layer=0.5e-6, gpu_launch_s=1e-6,
               gpu_hbm_bytes_per_s=1e9)


def test_bound_on_a_hand_checked_trace():
    """One layer, 3 experts, 1 slot; tokens per forward: {0:2}, {0:1, 1:3}, {1:1, 2:1}, {0:2, 1:1}.

    MIN with bypass: t0 misses 0 (keeps 0, next used at t1); t1 hits 0, misses 1 (keeps 1: used at
    t2, 0 only at t3); t2 hits 1, misses 2 (keeps 1: used at t3, 2 never); t3 hits 1, misses 0.
    Per access, min over k copies of max(GPU_k, k x 1 us, CPU rest):
      t0: k=0: max(0.5, 0, 2) = 2;  k=1: max(0.5 + 1 + 1, 1, 0) = 2.5      -> 2.0
      t1: k=0: max(0.5 + 1 + 1 + 0.1, 0, 3) = 3;  k=1: 3.6                 -> 3.0
      t2: k=0: max(2.6, 0, 2) = 2.6                                        -> 2.6
      t3: k=0: max(2.6, 0, 2) = 2.6                                        -> 2.6
    Total 10.2 us. Fused residency: 0.5 + 1 + active x 1 + tokens x 0.1 per forward:
    2.7 + 3.9 + 3.7 + 3.8 = 14.1 us (CPU and GPU in parallel beat the GPU alone here).
    """
    counts = np.zeros((1, 4, 3), dtype=np.int64)
    counts[0, 0, 0] = 2
    counts[0, 1, [0, 1]] = [1, 3]
    counts[0, 2, [1, 2]] = [1, 1]
    counts[0, 3, [0, 1]] = [2, 1]
    hits = np.zeros(counts.shape, dtype=bool)
    res = global_min(counts > 0, 1, hit_out=hits)
    assert res.hits == 3 and hits[0].nonzero()[0].tolist() == [1, 2, 3] and hits[0].nonzero()[1].tolist() == [0, 1, 1]
    b = bound_from_counts(counts, hits, np.ones(4, dtype=bool), CM)
    assert b.time_s == pytest.approx(10.2e-6) and b.full_time_s == pytest.approx(14.1e-6)
    assert (b.hits, b.misses) == (3, 4)
    # only timed forwards count
    assert bound_from_counts(counts, hits, np.array([False, True, True, False]), CM).time_s == pytest.approx(5.6e-6)


def test_access_bound_splits_misses_between_copy_engine_and_cpu():
    # four 1-token misses (CPU 2 us each), no hits: k=2 copies -> max(0.5 + 1 + 2, 2, 4) = 4; k=3 -> max(4.5, 3, 2)
    assert access_bound_s(np.array([]), np.array([1, 1, 1, 1]), CM) == pytest.approx(4.0e-6)
    assert access_bound_s(np.array([]), np.array([]), CM) == pytest.approx(0.5e-6)


def test_no_system_beats_the_bound_on_a_synthetic_trace():
    trace = synthetic_trace(num_layers=3, num_experts=64, top_k=8, block_length=16, num_blocks=3,
                            hidden_size=512, moe_intermediate_size=128, seed=4)
    cm = CostModel.h200_pcie5(2048, 512, kernel="grouped")
    for size in (8, 24):
        bound = physical_bound(trace, cm, size * 3)
        assert bound.ratio_to_full > 0
        for system in ("oled", "lru-full", "mixtral-offloading", "tide"):
            r = replay(trace, system, size, system=system, cost_model=cm, planner_s=0.0)
            assert r.sim_time_s >= bound.time_s, (system, size)
            assert r.full_time_s == pytest.approx(bound.full_time_s)
