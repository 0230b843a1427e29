"""The decomposition of a system's time above the LP bound (oled_hf/sim/decompose.py)."""

import numpy as np
import pytest

from oled_hf.offload.costmodel import CostModel
from oled_hf.offload.system import parse_system
from oled_hf.sim.bounds.lp import lp_bound
from oled_hf.sim.decompose import STEPS, KnownAheadTimeline, decompose
from oled_hf.sim.synthetic import synthetic_trace
from oled_hf.sim.timeline import Timeline


def test_shares_sum_to_the_gap_and_each_step_removes_its_cause():
    trace = synthetic_trace(num_layers=2, num_experts=16, top_k=2, block_length=8, num_blocks=2, seed=2)
    cm = CostModel.h200_pcie5(2048, 512, kernel="grouped")
    bound = lp_bound(trace, cm, 8, warmup_sequences=0, window_forwards=64).time_s
    d = decompose(trace, parse_system("oled"), 4, cm, 20e-6, bound, warmup_sequences=0)
    assert [name for name, _ in d.shares] == list(STEPS)
    assert sum(s for _, s in d.shares) == pytest.approx(d.system_s - bound)
    share = dict(d.shares)
    assert share["planner"] > 0  # 20 us per access on the host, on the critical path here
    assert share["CPU batch overhead"] >= 0  # the same decisions, each CPU batch 20 us shorter
    assert share["discovery at the router"] >= 0  # the same copies, issued earlier
    rows = d.table(1.0)
    assert rows[0][0] == "system" and rows[-1][0] == "valid bound" and len(rows) == len(STEPS) + 2


def test_known_ahead_timeline_issues_copies_at_the_layer_start_and_computes_after_the_router():
    """Non-expert 1 s, copy 2 s, one copied expert of 1 s on the GPU, no fixed cost.

    Routing at the router: the copy starts at 1, lands at 3, the expert ends at 4. Known ahead: it
    starts at 0, lands at 2, the expert ends at 3; an expert already resident still waits for the
    non-expert part (ends at 2, not 1).
    """
    for cls, end in ((Timeline, 4.0), (KnownAheadTimeline, 3.0)):
        tl = cls(2.0)
        start, plan = tl.begin_layer(1.0, 0.0)
        land = tl.copies(1, plan)
        assert tl.end_layer(start, plan, 0.0, land, np.array([1.0]), 0.0).end == end
    tl = KnownAheadTimeline(2.0)
    start, plan = tl.begin_layer(1.0, 0.0)
    assert plan == 0.0
    assert tl.end_layer(start, plan, 0.0, np.zeros(1), np.array([1.0]), 0.0).end == 2.0
