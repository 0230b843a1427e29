"""The valid LP bound (oled_hf/sim/bounds/lp.py): hand-checked, bracketed by exhaustive search, below replay."""

import numpy as np
import pytest

from oled_hf.offload.costmodel import CostModel
from oled_hf.sim.bounds.dual import dual_bound
from oled_hf.sim.bounds.lp import lp_bound, lp_bound_counts
from oled_hf.sim.bounds.physical import physical_bound
from oled_hf.sim.replay import replay
from oled_hf.sim.schedules.greedy import accesses_of, exhaustive_optimum, greedy_schedule
from oled_hf.sim.synthetic import synthetic_trace

# copy 1 us; CPU max(2 us, n x 1 us) + 0.5 us per batch; GPU 0.5 us per access + 1 us + 0.1 us/token; non-expert 0.5 us
CM = CostModel(expert_bytes=1000, h2d_bytes_per_s=1e9, gpu_expert_fixed_s=1e-6, gpu_s_per_token=0.1e-6,
               cpu_expert_fixed_s=2e-6, cpu_s_per_token=1e-6, nonexpert_s_per_layer=0.5e-6, gpu_launch_s=1e-6,
               gpu_hbm_bytes_per_s=1e9, gpu_layer_fixed_s=0.5e-6, cpu_overhead_s=0.5e-6)


def test_lp_bound_by_hand_splits_a_resident_expert_between_gpu_and_cpu():
    """One layer, one expert of one token in two forwards, one slot: the free initial cache holds it.

    Per access the LP serves a fraction g on the GPU and 1 - g on the CPU:
    max(0.5 g + 1.1 g, 0.5 (1 - g) + 2 (1 - g)) is least at g = 2.5 / 4.1: 1.6 x 2.5 / 4.1 = 0.9756 us;
    the first timed access has no non-expert part, the second 0.5 us: 2.4512 us in all. The best real
    schedule serves it on the GPU both times, each access 0.5 + 0.5 + 1.1 us (the timeline charges the
    first access's non-expert part too): 4.2 us. The greedy schedule starts from an empty cache: it
    copies the expert (lands at 0.5 + 1 us, then 1.1 us on the GPU: 2.6 us, against 0.5 + 0.5 + 2 = 3 us
    on the CPU), then hits (2.1 us): 4.7 us.
    """
    counts = np.zeros((1, 2, 2), dtype=np.int64)
    counts[0, :, 0] = 1
    b = lp_bound_counts(counts, np.ones(2, dtype=bool), CM, 1, 2)
    assert b.time_s == pytest.approx((2 * 1.6 * 2.5 / 4.1 + 0.5) * 1e-6, rel=1e-6)
    accs = accesses_of(counts, np.arange(2))
    assert exhaustive_optimum(accs, CM, 1) == pytest.approx(4.2e-6)
    assert greedy_schedule(accs, CM, 1) == pytest.approx(4.7e-6)


def test_a_cpu_served_miss_does_not_enter_the_cache_free():
    """Experts 0 and 1 alternate (4 forwards, 1 slot): the old MIN bound keeps each after a CPU miss for free.

    Whatever enters the cache pays a copy here, so the valid bound exceeds the old one's misses-at-min(copy, CPU)
    charge only where the copies bind; it must never exceed the exhaustive optimum.
    """
    counts = np.zeros((1, 4, 2), dtype=np.int64)
    counts[0, [0, 2], 0] = 3
    counts[0, [1, 3], 1] = 3
    b = lp_bound_counts(counts, np.ones(4, dtype=bool), CM, 1, 4)
    opt = exhaustive_optimum(accesses_of(counts, np.arange(4)), CM, 1)
    assert b.time_s <= opt + 1e-12
    assert b.time_s > 0.5 * opt  # not vacuous


def random_tiny(seed: int) -> tuple[np.ndarray, int]:
    """Token counts ``[L, F, E]`` (1-2 layers, 2-3 forwards, 2 experts) and 1-2 slots: exhaustive search's size."""
    rng = np.random.default_rng(seed)
    L, F, E = int(rng.integers(1, 3)), int(rng.integers(2, 4)), 2
    counts = rng.integers(1, 4, size=(L, F, E)) * (rng.random((L, F, E)) < 0.7)
    return counts, int(rng.integers(1, 3))


@pytest.mark.parametrize("seed", range(8))
def test_bracket_lp_le_exhaustive_optimum_le_greedy(seed):
    """Tiny random traces (1-2 layers, 2 experts, 2-3 forwards, 1-2 slots): LP <= every schedule's optimum <= greedy."""
    counts, S = random_tiny(seed)
    F = counts.shape[1]
    lp = lp_bound_counts(counts, np.ones(F, dtype=bool), CM, S, F).time_s
    accs = accesses_of(counts, np.arange(F))
    opt = exhaustive_optimum(accs, CM, S)
    assert lp <= opt + 1e-12
    assert opt <= greedy_schedule(accs, CM, S) + 1e-12


def test_windows_only_lower_the_bound():
    """Each window starts from a free cache: shorter windows give a lower (still valid) bound."""
    rng = np.random.default_rng(3)
    counts = rng.integers(0, 3, size=(2, 6, 6)) * (rng.random((2, 6, 6)) < 0.4)
    timed = np.ones(6, dtype=bool)
    whole = lp_bound_counts(counts, timed, CM, 3, 6).time_s
    halves = lp_bound_counts(counts, timed, CM, 3, 3)
    assert len(halves.windows) == 2
    assert halves.time_s <= whole + 1e-12


def test_no_system_beats_the_lp_bound_on_a_synthetic_trace():
    """Nor the whole-trace dual bound (sim/bounds/dual.py)."""
    trace = synthetic_trace(num_layers=2, num_experts=32, top_k=4, block_length=8, num_blocks=2,
                            hidden_size=512, moe_intermediate_size=128, seed=4)
    cm = CostModel.h200_pcie5(2048, 512, kernel="grouped")
    for size in (4, 12):
        bound = lp_bound(trace, cm, size * 2, window_forwards=64)
        assert bound.ratio_to_full > 0
        dual = dual_bound(trace, cm, size * 2, iterations=300)
        assert dual.ratio_to_full > 0.5
        for system in ("oled", "lru-full", "mixtral-offloading", "hybrimoe"):
            if system == "hybrimoe" and not trace.has_predictions:
                continue
            r = replay(trace, system, size, system=system, cost_model=cm, planner_s=0.0)
            assert r.sim_time_s >= max(bound.time_s, dual.time_s), (system, size)
            assert r.full_time_s == pytest.approx(bound.full_time_s)
        assert physical_bound(trace, cm, size * 2).full_time_s == pytest.approx(bound.full_time_s)


def test_bad_budget_and_window_are_refused():
    trace = synthetic_trace(num_layers=1, num_experts=8, top_k=2, block_length=4, num_blocks=1, seed=0)
    cm = CostModel.h200_pcie5(2048, 512, kernel="grouped")
    with pytest.raises(ValueError, match="total_slots=0"):
        lp_bound(trace, cm, 0)
    with pytest.raises(ValueError, match="window_forwards=0"):
        lp_bound(trace, cm, 4, window_forwards=0)
