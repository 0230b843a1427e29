"""The whole-trace dual bound (oled_hf/sim/dual_bound.py): valid at any prices, below exhaustive search and replay."""

import numpy as np
import pytest

from oled_hf.offload.costmodel import CostModel
from oled_hf.sim.bound import request_counts, timed_forwards
from oled_hf.sim.dual_bound import (
    Prices,
    _levels,
    _per_access,
    _problem,
    _project_rho,
    _repair,
    dual_bound_counts,
    dual_value,
)
from oled_hf.sim.offline import accesses_of, exhaustive_optimum
from oled_hf.sim.replay import replay
from oled_hf.sim.synthetic import synthetic_trace

# the cost model of tests/sim/test_lp_bound.py: copy 1 us; CPU max(2 us, n x 1 us) + 0.5 us per batch;
# GPU 0.5 us per access + 1 us + 0.1 us/token; non-expert 0.5 us
CM = CostModel(expert_bytes=1000, h2d_bytes_per_s=1e9, gpu_expert_fixed_s=1e-6, gpu_s_per_token=0.1e-6,
               cpu_expert_fixed_s=2e-6, cpu_s_per_token=1e-6, nonexpert_s_per_layer=0.5e-6, gpu_launch_s=1e-6,
               gpu_hbm_bytes_per_s=1e9, gpu_layer_fixed_s=0.5e-6, cpu_overhead_s=0.5e-6)


def _random_prices(rng, pb):
    """Feasible prices drawn at random (scales from none to far too much)."""
    n, j = pb.N, pb.access.size
    pr = Prices(rng.random(n) * rng.random() * 5, rng.random(n), rng.random(n) / (0.1 + 3 * rng.random()),
                rng.random(_levels(n)[-1][0] + 1) * rng.random(), rng.random(j) * rng.random(),
                rng.random(j) * rng.random())
    pr.project()
    return pr


@pytest.mark.parametrize("seed", range(10))
def test_any_prices_and_the_ascent_stay_below_the_exhaustive_optimum(seed):
    """Weak duality, checked: random feasible prices and the ascent's best are <= every schedule's optimum."""
    rng = np.random.default_rng(seed)
    L, F, E = int(rng.integers(1, 3)), int(rng.integers(2, 4)), 2
    counts = rng.integers(1, 4, size=(L, F, E)) * (rng.random((L, F, E)) < 0.7)
    S = int(rng.integers(1, 3))
    timed = np.ones(F, dtype=bool)
    opt = exhaustive_optimum(accesses_of(counts, np.arange(F)), CM, S)
    pb = _problem(counts, timed, CM, S)
    for _ in range(30):
        value, _ = dual_value(pb, _random_prices(rng, pb))
        assert value * 1e-6 <= opt + 1e-12
    best = dual_bound_counts(counts, timed, CM, S, iterations=200)
    assert best.time_s <= opt + 1e-12
    assert best.time_s > 0.5 * opt  # not vacuous


def test_repair_keeps_every_access_weight_non_negative():
    rng = np.random.default_rng(0)
    for n in (1, 2, 5, 16, 37):
        rho = _project_rho(rng.random(n))
        sigma = rng.random(_levels(n)[-1][0] + 1) * 3
        P = np.cumsum(rho[::-1])[::-1]
        _repair(sigma, P)
        assert (P + _per_access(sigma, n) <= 1 + 1e-12).all()
        assert (sigma >= 0).all()


def test_the_one_expert_case_by_hand():
    """One expert of one token in two forwards, one slot (test_lp_bound's hand case).

    Kept from the free initial cache, each access splits between the GPU (0.5 us launch + 1.1 us) and the
    CPU (0.5 us batch + 2 us); both relaxations price launch and batch per fraction served, so the
    dual's optimum is the LP's, 2 x 1.6 x 2.5 / 4.1 + 0.5 = 2.4512 us; the ascent gets within 1% of it
    from below (the best schedule takes 4.2 us).
    """
    counts = np.zeros((1, 2, 2), dtype=np.int64)
    counts[0, :, 0] = 1
    d = dual_bound_counts(counts, np.ones(2, dtype=bool), CM, 1, iterations=500).time_s
    assert 0.99 * 2.4512e-6 <= d <= 2.4512e-6 * (1 + 1e-6)


def test_no_system_beats_the_dual_bound_on_a_synthetic_trace():
    """As the LP's test: every replayed system, timed from the trace's start, is at or above the bound."""
    trace = synthetic_trace(num_layers=2, num_experts=32, top_k=4, block_length=8, num_blocks=2,
                            hidden_size=512, moe_intermediate_size=128, seed=4)
    cm = CostModel.h200_pcie5(2048, 512, kernel="grouped")
    counts, timed = request_counts(trace), timed_forwards(trace, 0)
    for size in (4, 12):
        bound = dual_bound_counts(counts, timed, cm, size * 2, iterations=500)
        assert bound.ratio_to_full > 0.5
        for system in ("oled", "lru-full", "mixtral-offloading", "hybrimoe"):
            if system == "hybrimoe" and not trace.has_predictions:
                continue
            r = replay(trace, system, size, system=system, cost_model=cm, planner_s=0.0)
            assert r.sim_time_s >= bound.time_s, (system, size)
            assert r.full_time_s == pytest.approx(bound.full_time_s)


def test_bad_budget_and_iterations_are_refused():
    counts = np.ones((1, 2, 2), dtype=np.int64)
    timed = np.ones(2, dtype=bool)
    with pytest.raises(ValueError, match="total_slots=0 must be >= 1"):
        dual_bound_counts(counts, timed, CM, 0)
    with pytest.raises(ValueError, match="iterations=0 must be >= 1"):
        dual_bound_counts(counts, timed, CM, 1, iterations=0)
