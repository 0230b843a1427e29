"""Belady bounds: exact on hand examples, never beaten by an online policy at the same budget."""

import numpy as np
import pytest

from oled_hf.offload.trace import TraceWriter
from oled_hf.sim.belady import belady_global, belady_min, next_uses
from oled_hf.sim.replay import replay
from oled_hf.sim.synthetic import synthetic_trace

POLICIES = ["oled", "lru", "lfu", "static", "tide"]


def hand_trace(requests_per_layer):
    """One forward per step; layer l requests requests_per_layer[l][t] (each row one expert)."""
    steps = len(requests_per_layer[0])
    w = TraceWriter(len(requests_per_layer), 8, 1, 4, hidden_size=8, moe_intermediate_size=8)
    for t in range(steps):
        ids = [np.asarray(r[t]).reshape(-1, 1) for r in requests_per_layer]
        w.add_forward("denoise", 0, t, ids, [np.ones_like(x, dtype=np.float32) for x in ids])
    return w.trace()


def test_hand_examples():
    tr = hand_trace([[[0], [1], [0]]])
    assert belady_min(tr, 1, bypass=False).hits == 0  # demand paging must hold 1 after step 1
    assert belady_min(tr, 1, bypass=True).hits == 1  # bypass keeps 0
    tr = hand_trace([[[0, 1, 2], [0, 1, 2], [2, 3]]])
    r = belady_min(tr, 2, bypass=False)
    assert (r.hits, r.misses) == (3, 5)  # |set| > capacity forces misses; keeps the 2 used soonest
    assert belady_global(hand_trace([[[0], [0]], [[1], [1]]]), 1).hits == 1


def test_next_uses():
    sets = np.zeros((1, 4, 3), dtype=bool)
    sets[0, [0, 2], 0] = True
    nxt = next_uses(sets)
    assert nxt[0, 0, 0] == 2 and nxt[0, 2, 0] > 100 and nxt[0, 0, 1] > 100


@pytest.fixture(scope="module")
def trace():
    return synthetic_trace(num_layers=3, num_experts=32, top_k=4, block_length=16, num_blocks=3,
                           popularity_scale=[0.5, 1.0, 2.0], seed=3)


@pytest.mark.parametrize("size", [3, 8, 16])
def test_min_bounds_every_policy_at_uniform_capacity(trace, size):
    demand = belady_min(trace, size, bypass=False).hit_rate
    bypass = belady_min(trace, size, bypass=True).hit_rate
    glob = belady_global(trace, size * trace.num_layers).hit_rate
    assert demand <= bypass + 1e-12 and bypass <= glob + 1e-12
    for policy in POLICIES:
        off = replay(trace, policy, size, layer_adaptive=False, cpu_compute="off").hit_rate
        auto = replay(trace, policy, size, layer_adaptive=False, cpu_compute="auto").hit_rate
        assert off <= demand + 1e-12, policy  # demand MIN bounds runs that copy every miss
        assert auto <= bypass + 1e-12, policy  # MIN with bypass bounds runs that may bypass
        adaptive = replay(trace, policy, size, layer_adaptive=True, cpu_compute="auto").hit_rate
        assert adaptive <= glob + 1e-12, policy  # only the global budget bounds adaptive splits
