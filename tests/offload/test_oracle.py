"""The ladder's oracle retention parts (replay only): belady equals Belady's MIN, next-oracle knows one step."""

import numpy as np
import pytest

from oled_hf import OffloadConfig
from oled_hf.offload.costmodel import CostModel
from oled_hf.offload.policies.oracle import forward_rank, held_reuse, next_use
from oled_hf.offload.system import parse_system
from oled_hf.sim.belady import request_sets
from oled_hf.sim.replay import hit_bound, replay
from oled_hf.sim.synthetic import synthetic_trace


@pytest.fixture(scope="module")
def trace():
    return synthetic_trace(num_layers=3, num_experts=32, top_k=4, block_length=16, num_blocks=3, num_sequences=2)


def future_of(trace):
    return list(request_sets(trace))


def _run(trace, parts, size, future=None):
    system = parse_system(parts)
    if future is not None:
        system = system.with_knobs(retention__future=future)
    return replay(trace, parts, size, system=system, planner_s=0.0)


def test_next_use_scans_the_future():
    used = np.array([[1, 0, 1], [0, 0, 1], [1, 0, 0]], dtype=bool)
    big = np.iinfo(np.int32).max
    assert next_use(used).tolist() == [[2, big, 1], [2, big, big], [big, big, big]]


def test_held_reuse_counts_the_uses_a_copy_is_kept_for():
    """Hand-worked: accesses {0,1}, {0,2}, {1}, {0}, {2}. At one slot expert 0 copied at access 0 serves access 1
    only (at access 1 expert 1 is used before 0 again); at two slots it serves accesses 1 and 3."""
    used = np.zeros((5, 3), dtype=bool)
    for t, ids in enumerate(([0, 1], [0, 2], [1], [0], [2])):
        used[t, ids] = True
    nxt = next_use(used)
    rank = forward_rank(nxt)
    assert rank.tolist() == [[0, 2, 0], [1, 0, 2], [0, 2, 1], [1, 1, 0], [0, 0, 0]]
    assert held_reuse(nxt, rank, 1).tolist() == [[1, 0, 1], [0, 1, 0], [1, 0, 0], [0, 0, 1], [0, 0, 0]]
    assert held_reuse(nxt, rank, 2).tolist() == [[2, 0, 1], [1, 1, 0], [1, 0, 1], [0, 0, 1], [0, 0, 0]]


@pytest.mark.parametrize("base", ["belady", "lru"])
def test_exact_reuse_rungs_differ_only_in_admission(trace, base):
    """Pure caching copies every miss, so the exact reuse changes nothing; under reuse copies it is what admits."""
    future = future_of(trace)
    oracle, base_future = f"{base}-reuse", future if base == "belady" else None
    copy = {r: _run(trace, f"{r}+copy+uniform", 12, f) for r, f in ((base, base_future), (oracle, future))}
    assert copy[base].sim_time_s == copy[oracle].sim_time_s
    assert copy[base].hit_rate == copy[oracle].hit_rate
    cm = CostModel.h200_pcie5(2048, 512, kernel="grouped")  # mini-sized experts: misses split between CPU and copies
    fair = {}
    for r, f in ((base, base_future), (oracle, future)):
        system = parse_system(f"{r}+cpu+reuse+adaptive")
        fair[r] = replay(trace, r, 12, system=system if f is None else system.with_knobs(retention__future=f),
                         cost_model=cm, planner_s=0.0)
    assert fair[base].sim_time_s != fair[oracle].sim_time_s


@pytest.mark.parametrize("size", [8, 12, 20, 24])
def test_belady_retention_reaches_demand_min(trace, size):
    """An independent check of both: the planner driven by belady's priority hits as often as MIN, exactly where
    every access fits the cache (else the planner streams a request's overflow, MIN does not: within 0.2%)."""
    hit = _run(trace, "belady+copy+uniform", size, future_of(trace)).hit_rate
    bound = hit_bound(trace, size, False, True).hit_rate
    widest = max(int(f.sum(axis=1).max()) for f in future_of(trace))
    if size >= widest:
        assert hit == bound
    else:
        assert abs(hit - bound) <= 0.002


def test_rungs_are_ordered_in_pure_caching(trace):
    future = future_of(trace)
    hits = {r: _run(trace, f"{r}+copy+uniform", 12, future if r in ("belady", "next-oracle") else None).hit_rate
            for r in ("belady", "next-oracle", "lru")}
    assert hits["belady"] >= hits["next-oracle"] >= hits["lru"] and hits["belady"] > hits["lru"]


def test_foresight_spans_next_oracle_to_belady(trace):
    """Belady within K accesses, LRU beyond: a horizon past the trace is belady itself; hits grow with K."""
    future = future_of(trace)
    far = _run(trace, "foresight+copy+uniform", 12, future)  # default horizon 4
    system = parse_system("foresight+copy+uniform").with_knobs(retention__future=future, retention__horizon=10**6)
    whole = replay(trace, "foresight", 12, system=system, planner_s=0.0)
    belady = _run(trace, "belady+copy+uniform", 12, future)
    assert whole.hit_rate == belady.hit_rate and whole.sim_time_s == belady.sim_time_s
    hits = []
    for k in (1, 4, 10**6):
        system = parse_system("foresight+copy+uniform").with_knobs(retention__future=future, retention__horizon=k)
        hits.append(replay(trace, "foresight", 12, system=system, planner_s=0.0).hit_rate)
    assert hits[0] <= hits[1] <= hits[2] and hits[1] == far.hit_rate
    bad = parse_system("foresight+copy+uniform").with_knobs(retention__future=future, retention__horizon=0)
    with pytest.raises(ValueError, match=r"foresight horizon=0 is invalid: must be an integer >= 1"):
        replay(trace, "foresight", 12, system=bad, planner_s=0.0)


def test_oracles_refuse_a_missing_or_foreign_future(trace):
    with pytest.raises(ValueError, match="'next-oracle' is an oracle for trace replay only: it needs the trace's "
                                         "future"):
        _run(trace, "next-oracle+copy+uniform", 12)
    other = synthetic_trace(num_layers=3, num_experts=32, top_k=4, block_length=16, num_blocks=3, seed=7)
    with pytest.raises(ValueError, match=r"access \d+ of MoE layer \d does not match the future"):
        _run(trace, "belady+copy+uniform", 12, future_of(other))
    with pytest.raises(ValueError, match="retention.future has 2 layers; the run has 3 MoE layers of 32 experts"):
        _run(trace, "belady+copy+uniform", 12, future_of(trace)[:2])


def test_a_live_config_refuses_an_oracle():
    with pytest.raises(ValueError, match="its retention 'belady' is an oracle that reads the trace's future"):
        OffloadConfig(cache_size=4, system="belady+cpu+reuse+adaptive")
    OffloadConfig(cache_size=4, system="previous-set+cpu+reuse+adaptive")  # no future: live is fine
