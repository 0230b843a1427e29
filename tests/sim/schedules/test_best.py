"""The upper side of the bracket (oled_hf/sim/schedules/best.py): offline schedules on the timeline, above
the LP bound."""

import numpy as np
import pytest

from oled_hf.offload.costmodel import CostModel
from oled_hf.offload.system import parse_system
from oled_hf.sim.belady import request_sets
from oled_hf.sim.bounds.lp import lp_bound
from oled_hf.sim.demand import timed_forwards
from oled_hf.sim.ladder import rung_system
from oled_hf.sim.replay import replay
from oled_hf.sim.schedules import offline_schedules
from oled_hf.sim.synthetic import synthetic_trace


@pytest.mark.parametrize("size", [4, 8])
def test_every_offline_schedule_is_above_the_lp_bound_and_the_best_is_the_least(size):
    trace = synthetic_trace(num_layers=2, num_experts=16, top_k=2, block_length=8, num_blocks=3, seed=5)
    cm = CostModel.h200_pcie5(2048, 512, kernel="grouped")
    bound = lp_bound(trace, cm, size * trace.num_layers, warmup_sequences=0, window_forwards=64).time_s
    fair = parse_system("lru-full")
    rows = offline_schedules(trace, cm, size, fair, warmup_sequences=0)
    names = [name for name, _ in rows.rows]
    assert names[0].startswith("greedy offline schedule (credit ")
    assert names[1].startswith("greedy + prefetch into idle copy time (credit ")
    assert names[2:] == ["belady + the strongest fair dispatch (offline)", "belady, pure caching (offline)"]
    assert all(t >= bound * (1 - 1e-9) for _, t in rows.rows)
    assert rows.best_s == min(t for _, t in rows.rows)
    # the oracle rows are replay itself with the belady retention and no planner: the same seconds
    lru = replay(trace, "lru-full", size, system=fair, cost_model=cm, planner_s=0.0, warmup_sequences=0).sim_time_s
    assert rows.rows[2][1] <= lru * 1.05  # knowing the whole future is not much worse than lru, here it is better


def test_a_cut_short_mask_times_only_the_greedy_schedules_and_an_empty_one_is_refused():
    trace = synthetic_trace(num_layers=2, num_experts=16, top_k=2, block_length=8, num_blocks=2, seed=1)
    cm = CostModel.h200_pcie5(2048, 512, kernel="grouped")
    timed = timed_forwards(trace, 0).copy()
    keep = np.flatnonzero(timed)[:3]
    timed[:] = False
    timed[keep] = True
    rows = offline_schedules(trace, cm, 4, parse_system("lru-full"), timed=timed)
    whole = offline_schedules(trace, cm, 4, parse_system("lru-full"), warmup_sequences=0)
    assert len(rows.rows) == 2 and rows.best_s < whole.rows[0][1]  # 3 timed forwards take less than all
    with pytest.raises(ValueError, match="no timed forward"):
        offline_schedules(trace, cm, 4, parse_system("lru-full"), timed=np.zeros_like(timed))


def test_offline_schedules_pay_the_planner_time_every_system_pays():
    """Charged ``planner_s`` per layer access (the report charges every system's), every schedule takes longer;
    the oracle rows are replay's own with that planner time."""
    trace = synthetic_trace(num_layers=2, num_experts=16, top_k=2, block_length=8, num_blocks=2, seed=2)
    cm = CostModel.h200_pcie5(2048, 512, kernel="grouped")
    fair = parse_system("lru-full")
    bare = offline_schedules(trace, cm, 6, fair, warmup_sequences=0)
    paid = offline_schedules(trace, cm, 6, fair, warmup_sequences=0, planner_s=50e-6)
    assert all(p > b for (_, p), (_, b) in zip(paid.rows, bare.rows))
    oracle = replay(trace, "belady", 6, system=rung_system(fair, "belady", list(request_sets(trace))), cost_model=cm,
                    planner_s=50e-6, warmup_sequences=0).sim_time_s
    assert paid.rows[2][1] == oracle
    for bad in (-1e-6, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="planner_s=.* is invalid: must be a number >= 0"):
            offline_schedules(trace, cm, 6, fair, warmup_sequences=0, planner_s=bad)
