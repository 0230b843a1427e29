"""The coupled LP bound (oled_hf/sim/bounds/coupled.py): valid at any prices, and tighter than free-cache windows."""

import numpy as np
import pytest

from oled_hf.offload.costmodel import CostModel
from oled_hf.sim.bounds.coupled import coupled_pass, lp_bound_coupled
from oled_hf.sim.bounds.lp import lp_bound_counts, window_requests
from oled_hf.sim.schedules.greedy import accesses_of, exhaustive_optimum, greedy_schedule

from .test_lp import CM


def _windows(counts, w):
    F = counts.shape[1]
    return [window_requests(counts, np.arange(F)[s:s + w]) for s in range(0, F, w)]


@pytest.mark.parametrize("seed", range(10))
def test_any_prices_give_a_bound_below_the_exhaustive_optimum(seed):
    """Tiny random traces cut into 1-forward windows, random prices per item and boundary: L(prices) <= optimum."""
    rng = np.random.default_rng(seed)
    L, F, E = int(rng.integers(1, 3)), int(rng.integers(2, 4)), 2
    F = min(F, 2) if L == 2 else F  # exhaustive search is exponential: at most 4 accesses, 4 experts
    counts = rng.integers(1, 4, size=(L, F, E)) * (rng.random((L, F, E)) < 0.7)
    S = int(rng.integers(1, 3))
    reqs = _windows(counts, 1)
    opt = exhaustive_optimum(accesses_of(counts, np.arange(F)), CM, S)
    for _ in range(3):
        prices = [rng.random(L * E) * rng.choice([0.5, 3.0, 20.0]) for _ in range(len(reqs) - 1)]
        value, starts, ends = coupled_pass(reqs, CM, S, prices)
        assert value <= opt + 1e-12, (value, opt)
        assert all(s.shape == (L * E,) for s in starts) and all(0 - 1e-9 <= e.min() for e in ends)


def test_coupling_raises_the_bound_where_the_working_set_drifts():
    """2 layers x 48 experts, 8 forwards, the working set shifting by 12 experts every 2 forwards.

    Free-cache windows of 2 forwards get each new working set for nothing; the priced passes make
    the windows pay to change it, so the coupled bound rises well above the free one (measured:
    2.37 -> 3.48 ms at 20 slots), while staying below a real schedule (the greedy offline one).
    """
    cm = CostModel.h200_pcie5(2048, 512, kernel="grouped")
    rng = np.random.default_rng(0)
    counts = np.zeros((2, 8, 48), dtype=np.int64)
    for f in range(8):
        for l in range(2):
            ids = ((f // 2) * 12 + rng.choice(16, 12, replace=False)) % 48
            counts[l, f, ids] = rng.integers(1, 6, 12)
    timed = np.ones(8, dtype=bool)
    free = lp_bound_counts(counts, timed, cm, 20, 2).time_s
    coupled = lp_bound_coupled(counts, timed, cm, 20, 2, passes=4)
    assert coupled.time_s > 1.2 * free, (coupled.passes_s, free)
    assert coupled.time_s == max(coupled.passes_s) and len(coupled.passes_s) == 4 and coupled.num_windows == 4
    assert coupled.time_s <= greedy_schedule(accesses_of(counts, np.arange(8)), cm, 20)


def test_bad_prices_and_passes_are_refused():
    counts = np.ones((1, 2, 2), dtype=np.int64)
    reqs = _windows(counts, 1)
    with pytest.raises(ValueError, match="price_out must be finite and >= 0"):
        coupled_pass(reqs, CM, 1, [np.array([-1.0, 0.0])])
    with pytest.raises(ValueError, match="1 boundaries given, the 2 windows have 1|prices: 2 boundaries"):
        coupled_pass(reqs, CM, 1, [np.zeros(2), np.zeros(2)])
    with pytest.raises(ValueError, match="step0_us=-1"):
        lp_bound_coupled(counts, np.ones(2, dtype=bool), CM, 1, 1, step0_us=-1)
    with pytest.raises(ValueError, match="passes=0"):
        lp_bound_coupled(counts, np.ones(2, dtype=bool), CM, 1, 1, passes=0)
