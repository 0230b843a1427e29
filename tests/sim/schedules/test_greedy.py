"""Offline schedules (oled_hf/sim/schedules/greedy.py): the reuse credit and the best of the greedy variants."""

import numpy as np
import pytest

from oled_hf.sim.bounds.lp import lp_bound_counts
from oled_hf.sim.schedules.greedy import CREDITS, accesses_of, best_greedy, exhaustive_optimum, greedy_schedule

from ..bounds.test_lp import CM


def test_a_reuse_credit_takes_a_copy_that_pays_later():
    """One expert, 1 slot, 3 tokens in each of 4 forwards, the cache empty at the start.

    The credit counts the CPU time a copy saves at the expert's next use, so the credited schedule
    copies no later than the myopic one; it is never slower here, and both are at least the
    exhaustive optimum. best_greedy returns the least time over its credits.
    """
    counts = np.zeros((1, 4, 1), dtype=np.int64)
    counts[0, :, 0] = 3
    accs = accesses_of(counts, np.arange(4))
    opt = exhaustive_optimum(accs, CM, 1)
    t0, t1 = greedy_schedule(accs, CM, 1), greedy_schedule(accs, CM, 1, reuse_credit=1.0)
    assert opt - 1e-12 <= t1 <= t0 + 1e-12
    assert best_greedy(accs, CM, 1) == (min(greedy_schedule(accs, CM, 1, reuse_credit=c) for c in CREDITS),
                                        best_greedy(accs, CM, 1)[1])


@pytest.mark.parametrize("seed", range(6))
def test_every_credit_stays_inside_the_bracket(seed):
    """Tiny random traces: LP <= exhaustive optimum <= greedy at every credit."""
    rng = np.random.default_rng(seed + 100)
    L, E = int(rng.integers(1, 3)), 2
    F = 2 if L == 2 else 3  # exhaustive search is exponential: at most 4 accesses
    counts = rng.integers(1, 6, size=(L, F, E)) * (rng.random((L, F, E)) < 0.8)
    S = int(rng.integers(1, 3))
    accs = accesses_of(counts, np.arange(F))
    opt = exhaustive_optimum(accs, CM, S)
    assert lp_bound_counts(counts, np.ones(F, dtype=bool), CM, S, F).time_s <= opt + 1e-12
    for c in CREDITS:
        assert opt <= greedy_schedule(accs, CM, S, reuse_credit=c) + 1e-12
    assert best_greedy(accs, CM, S)[0] >= opt - 1e-12


def test_bad_credit_is_refused():
    accs = accesses_of(np.ones((1, 1, 1), dtype=np.int64), np.arange(1))
    with pytest.raises(ValueError, match="reuse_credit=-0.5 must be a finite number >= 0"):
        greedy_schedule(accs, CM, 1, reuse_credit=-0.5)
    with pytest.raises(ValueError, match="credits must name"):
        best_greedy(accs, CM, 1, credits=())
