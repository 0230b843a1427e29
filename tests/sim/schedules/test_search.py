"""Greedy + prefetch offline schedules (oled_hf/sim/schedules/search.py): the bracket's tighter upper side."""

import numpy as np
import pytest

from oled_hf.sim.bounds.lp import lp_bound_counts
from oled_hf.sim.schedules.greedy import CREDITS, accesses_of, exhaustive_optimum, greedy_schedule
from oled_hf.sim.schedules.search import VARIANTS, Variant, best_search, search_schedule

from ..bounds.test_lp import CM


def test_a_prefetch_into_idle_copy_time_hides_the_next_layers_miss():
    """Two layers, one expert each, one forward, 2 slots: 1 token at layer 0, 5 tokens at layer 1.

    The greedy copies no expert without a next use: layer 0 on the CPU (0.5 + 0.5 + 2 us), layer 1
    on the CPU (0.5 + 0.5 + 5 us): 9 us. With a prefetch at layer 0's plan (0.5 us) the engine,
    idle until layer 1's plan, lands layer 1's expert at 1.5 us; layer 1 starts at 3, plans at 3.5
    and runs it on the GPU (0.5 launch + 1 + 0.5 us): 5.5 us, still at or above the LP bound.
    """
    counts = np.zeros((2, 1, 1), dtype=np.int64)
    counts[0, 0, 0], counts[1, 0, 0] = 1, 5
    accs = accesses_of(counts, np.arange(1))
    assert greedy_schedule(accs, CM, 2) == pytest.approx(9e-6)
    s = search_schedule(accs, CM, 2, variant=Variant(0.0, 1, 0))
    assert s.time_s == pytest.approx(5.5e-6)
    assert s.prefetches == 1 and s.demand_copies == 0
    assert lp_bound_counts(counts, np.ones(1, dtype=bool), CM, 2, 1).time_s <= s.time_s + 1e-12


@pytest.mark.parametrize("seed", range(5))
def test_horizon_zero_is_the_greedy_schedule(seed):
    rng = np.random.default_rng(seed + 200)
    counts = rng.integers(1, 6, size=(2, 4, 4)) * (rng.random((2, 4, 4)) < 0.6)
    accs = accesses_of(counts, np.arange(4))
    for c in CREDITS:
        s = search_schedule(accs, CM, 3, timed_from=2, variant=Variant(c, 0, 0))
        assert s.time_s == pytest.approx(greedy_schedule(accs, CM, 3, 2, c), rel=1e-12)
        assert s.prefetches == 0


@pytest.mark.parametrize("seed", range(6))
def test_lp_le_every_variant_and_optimum_le_greedy_variants(seed):
    """Tiny random traces: LP <= exhaustive optimum <= each horizon-0 variant; LP <= every prefetching variant.

    Prefetching lies outside exhaustive_optimum's schedules (demand copies only), so a prefetching
    variant may beat that search, never the LP bound, which relaxes every schedule the timeline runs.
    """
    rng = np.random.default_rng(seed + 300)
    L, E = int(rng.integers(1, 3)), 2
    F = 2 if L == 2 else 3
    counts = rng.integers(1, 6, size=(L, F, E)) * (rng.random((L, F, E)) < 0.8)
    S = int(rng.integers(1, 3))
    accs = accesses_of(counts, np.arange(F))
    lp = lp_bound_counts(counts, np.ones(F, dtype=bool), CM, S, F).time_s
    opt = exhaustive_optimum(accs, CM, S)
    assert lp <= opt + 1e-12
    for v in VARIANTS:
        t = search_schedule(accs, CM, S, variant=v).time_s
        assert lp <= t + 1e-12, v
        if v.horizon == 0:
            assert opt <= t + 1e-12, v
    assert best_search(accs, CM, S).time_s == pytest.approx(min(search_schedule(accs, CM, S, variant=v).time_s
                                                                for v in VARIANTS))


@pytest.mark.parametrize("seed", range(4))
def test_lp_le_prefetching_schedules_on_larger_random_traces(seed):
    """3 layers x 4 experts, 4 forwards, 2-5 slots: every variant stays at or above the LP bound (one window)."""
    rng = np.random.default_rng(seed + 400)
    counts = rng.integers(1, 8, size=(3, 4, 4)) * (rng.random((3, 4, 4)) < 0.6)
    S = int(rng.integers(2, 6))
    accs = accesses_of(counts, np.arange(4))
    lp = lp_bound_counts(counts, np.ones(4, dtype=bool), CM, S, 4).time_s
    assert min(search_schedule(accs, CM, S, variant=v).time_s for v in VARIANTS) >= lp - 1e-12


def test_bad_variant_is_refused():
    accs = accesses_of(np.ones((1, 1, 1), dtype=np.int64), np.arange(1))
    with pytest.raises(ValueError, match="bad variant"):
        search_schedule(accs, CM, 1, variant=Variant(0.0, -1, 0))
    with pytest.raises(ValueError, match="variants must name"):
        best_search(accs, CM, 1, variants=())
