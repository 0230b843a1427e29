"""The one entry of the bounds (oled_hf/sim/bounds/__init__.py): each kind is its module's bound, options checked."""

import numpy as np
import pytest

from oled_hf.offload.costmodel import CostModel
from oled_hf.sim.bounds import BOUNDS, lower_bound
from oled_hf.sim.bounds.coupled import lp_bound_coupled
from oled_hf.sim.bounds.dual import dual_bound
from oled_hf.sim.bounds.lp import lp_bound
from oled_hf.sim.bounds.physical import physical_bound
from oled_hf.sim.demand import request_counts, timed_forwards
from oled_hf.sim.synthetic import synthetic_trace

CM = CostModel.h200_pcie5(2048, 512, kernel="grouped")


@pytest.fixture(scope="module")
def trace():
    return synthetic_trace(num_layers=2, num_experts=16, top_k=4, block_length=8, num_blocks=2, num_sequences=2,
                           hidden_size=512, moe_intermediate_size=128, seed=3)


def test_each_kind_is_its_modules_bound(trace):
    total, warm = 12, 1
    counts, timed = request_counts(trace), timed_forwards(trace, warm)
    assert lower_bound("min", trace, CM, total, warm).time_s == physical_bound(trace, CM, total, warm).time_s
    lp = lp_bound(trace, CM, total, warm, 2)
    assert lower_bound("lp", trace, CM, total, warm, window_forwards=2).time_s == lp.time_s
    coupled = lp_bound_coupled(counts, timed, CM, total, 2, passes=2)
    assert lower_bound("coupled", trace, CM, total, warm, window_forwards=2, passes=2).time_s == coupled.time_s
    dual = dual_bound(trace, CM, total, warm, iterations=20)
    assert lower_bound("dual", trace, CM, total, warm, iterations=20).time_s == dual.time_s
    results = [lower_bound(k, trace, CM, total, warm, **({"iterations": 20} if k == "dual" else {})) for k in BOUNDS]
    full = {r.full_time_s for r in results}
    assert len({round(f, 15) for f in full}) == 1  # every bound over the same forwards, the same fused time
    assert all(0 < r.ratio_to_full for r in results)


def test_a_timed_mask_replaces_the_warmup(trace):
    timed = timed_forwards(trace, 1)
    assert lower_bound("lp", trace, CM, 12, timed=timed).time_s == lower_bound("lp", trace, CM, 12, 1).time_s
    first = np.zeros_like(timed)
    first[np.flatnonzero(timed)[:2]] = True
    assert lower_bound("lp", trace, CM, 12, timed=first).full_time_s < lower_bound("lp", trace, CM, 12, 1).full_time_s


def test_an_unknown_kind_or_option_is_refused(trace):
    with pytest.raises(ValueError, match=r"bound 'belady' is unknown; allowed: min, lp, coupled, dual"):
        lower_bound("belady", trace, CM, 12)
    with pytest.raises(ValueError, match=r"bound 'dual' takes no option window_forwards; its options: iterations"):
        lower_bound("dual", trace, CM, 12, window_forwards=2)
    with pytest.raises(ValueError, match=r"bound 'min' takes no option passes; its options: none"):
        lower_bound("min", trace, CM, 12, passes=2)
