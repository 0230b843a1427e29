"""The decomposition of a system's time above the LP bound (oled_hf/sim/decompose.py)."""

import pytest

from oled_hf.offload.costmodel import CostModel
from oled_hf.offload.system import parse_system
from oled_hf.sim.decompose import STEPS, decompose
from oled_hf.sim.lp_bound import lp_bound
from oled_hf.sim.synthetic import synthetic_trace


def test_shares_sum_to_the_gap_and_the_planner_share_is_its_time():
    trace = synthetic_trace(num_layers=2, num_experts=16, top_k=2, block_length=8, num_blocks=2, seed=2)
    cm = CostModel.h200_pcie5(2048, 512, kernel="grouped")
    bound = lp_bound(trace, cm, 8, warmup_sequences=0, window_forwards=64).time_s
    d = decompose(trace, parse_system("oled"), 4, cm, 20e-6, bound, warmup_sequences=0)
    assert [name for name, _ in d.shares] == list(STEPS)
    assert sum(s for _, s in d.shares) == pytest.approx(d.system_s - bound)
    assert d.shares[0][1] > 0  # 20 us per access on the host, on the critical path here
    assert d.shares[2][1] >= 0  # the oracle run is a schedule: never below the valid bound
    rows = d.table(1.0)
    assert rows[0][0] == "system" and rows[-1][0] == "valid LP bound" and len(rows) == len(STEPS) + 2
