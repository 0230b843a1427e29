"""CacheState: planning rules, streaming, budget invariants across rebalances."""

import numpy as np
import pytest

from oled_hf.offload.costmodel import CostModel
from oled_hf.offload.dispatch import Dispatcher
from oled_hf.offload.planner import CacheState
from oled_hf.offload.policies import make_policy

OFF = Dispatcher(None, "off")
CM = CostModel.h200_pcie5(2048, 512)


def ids(*experts):
    return np.asarray(experts, dtype=np.int64).reshape(-1, 1)


class Device:
    """Executes plans on a fake slot pool and checks what the runtime would rely on."""

    def __init__(self, state):
        self.state = state
        self.slots = {}

    def run(self, plan, capacity):
        for e in plan.hits:
            assert self.slots[plan.slot_of[e]] == e, "a hit must be in its slot at the start"
        computed = set(plan.hits)
        requested = set(plan.hits) | {c[0] for c in plan.copies} | set(plan.cpu)
        for expert, slot, evicted in plan.copies:
            if evicted is None:
                assert slot not in self.slots or self.slots[slot] is None
            else:
                assert self.slots[slot] == evicted
                if evicted in requested:
                    assert evicted in computed, "only already-computed experts of this access may be evicted"
            self.slots[slot] = expert
            computed.add(expert)
            layer_slots = [s for s, e in self.slots.items() if e is not None and self.state.slot_owner[s] == plan.layer]
            assert len(layer_slots) <= capacity
        assert set(plan.cpu).isdisjoint(computed)
        for expert, slot, evicted in plan.background:  # reuse copies: after the access, of CPU experts
            assert expert in plan.cpu and (evicted is None or evicted not in requested)
            assert self.slots.get(slot) == evicted
            self.slots[slot] = expert


def test_hits_and_misses_count_unique_experts():
    st = CacheState(1, 8, [4])
    pol = make_policy("lru", 1, 8)
    pol.observe_access(0, ids(1, 1, 2, 2, 2), None, 1)
    p = st.plan(0, ids(1, 1, 2, 2, 2), None, pol, OFF)
    assert p.hits == [] and sorted(c[0] for c in p.copies) == [1, 2] and p.cpu == []
    pol.observe_access(0, ids(1, 2, 3), None, 2)
    p = st.plan(0, ids(1, 2, 3), None, pol, OFF)
    assert p.hits == [1, 2] and [c[0] for c in p.copies] == [3]
    assert st.stats.hits == [2] and st.stats.misses == [3] and st.stats.copies == [3]
    st.check_invariants()


def test_evicts_lowest_priority_non_requested_first():
    st = CacheState(1, 8, [3])
    pol = make_policy("lru", 1, 8)
    for clock, e in enumerate([0, 1, 2], start=1):  # 0 oldest, 2 newest
        pol.observe_access(0, ids(e), None, clock)
        st.plan(0, ids(e), None, pol, OFF)
    pol.observe_access(0, ids(0, 5), None, 4)
    p = st.plan(0, ids(0, 5), None, pol, OFF)
    assert p.hits == [0] and p.copies == [(5, p.slot_of[5], 1)]  # 1 is the LRU non-requested
    st.check_invariants()


def test_streams_when_request_exceeds_capacity():
    st = CacheState(2, 16, [2, 3])
    dev = Device(st)
    pol = make_policy("lru", 2, 16)
    for clock, req in enumerate([(0, 1), (0, 1, 2, 3, 4, 5), (5, 6, 7, 8)], start=1):
        pol.observe_access(1, ids(*req), None, clock)
        p = st.plan(1, ids(*req), None, pol, OFF)
        dev.run(p, 3)
        assert len(p.hits) + len(p.copies) == len(req)  # cpu off: every miss is copied
        st.check_invariants()
    assert len(st.resident(1)) == 3 and st.stats.evictions[1] > 0


@pytest.mark.parametrize("policy", ["oled", "lru", "lfu", "static", "tide"])
@pytest.mark.parametrize("cpu", ["auto", "off"])
def test_budget_invariants_random_trace_with_rebalances(policy, cpu):
    rng = np.random.default_rng(0)
    L, E = 3, 24
    st = CacheState(L, E, [4, 6, 8], expert_bytes=100)
    dev = Device(st)
    pol = make_policy(policy, L, E)
    disp = Dispatcher(CM, cpu)
    for clock in range(1, 60):
        for layer in range(L):
            route = rng.integers(0, E, size=(rng.integers(1, 12), 2))
            route[:, 1] = (route[:, 0] + 1 + rng.integers(0, E - 1, size=route.shape[0])) % E
            w = rng.random(route.shape)
            pol.observe_access(layer, route, w, clock)
            p = st.plan(layer, route, w, pol, disp)
            dev.run(p, st.capacities[layer])
            if cpu == "off":
                assert p.cpu == []
        if clock % 7 == 0:
            caps = rng.multinomial(18 - 3, [1 / 3] * 3) + 1
            moves = st.set_capacities([int(c) for c in caps], pol)
            for layer, slot, evicted in moves:
                if evicted >= 0:
                    assert evicted not in st.resident(layer)
                dev.slots.pop(slot, None)
        st.check_invariants()
    s = st.stats
    assert s.total("hits") + s.total("misses") == sum(
        s.hits[i] + s.misses[i] for i in range(L)
    ) and s.total("bytes_copied") == 100 * s.total("copies")


def test_set_capacities_moves_slots():
    st = CacheState(2, 8, [3, 1])
    pol = make_policy("lru", 2, 8)
    for clock, e in enumerate([0, 1, 2], start=1):
        pol.observe_access(0, ids(e), None, clock)
        st.plan(0, ids(e), None, pol, OFF)
    moves = st.set_capacities([1, 3], pol)
    assert [m.evicted_expert for m in moves] == [0, 1] and all(m.layer == 0 for m in moves)
    assert st.resident(0).keys() == {2} and len(st.slots_of_layer(1)) == 3
    assert st.stats.rebalance_evictions == [2, 0]
    st.check_invariants()
    with pytest.raises(ValueError, match="sum to 5"):
        st.set_capacities([2, 3], pol)
    with pytest.raises(ValueError, match=r"in \[1, num_experts=8\]"):
        st.set_capacities([0, 4], pol)


def test_capacity_validation():
    with pytest.raises(ValueError, match="one per MoE layer"):
        CacheState(2, 8, [3])
    with pytest.raises(ValueError, match="num_experts=8"):
        CacheState(1, 8, [9])


def test_reuse_copies_cache_cpu_misses_off_the_critical_path():
    """Planner rule 4: a CPU-computed miss with high predicted reuse is also copied into a slot
    (free first, else evicting a lower-priority resident not requested now); it hits next access."""
    policy = make_policy("oled", 1, 8)
    state = CacheState(1, 8, [2], expert_bytes=10)
    # copies so slow every miss goes to the CPU; the dispatch part cpu+reuse with one reuse copy per access
    cpu_all = Dispatcher(CM.with_overrides(h2d_gbps=1e-3, host_dram_gbps=0), "on", reuse_copies=1, reuse_min=0.0)
    rows = ids(3, 3, 3, 5)
    policy.observe_access(0, rows, None, 1)
    plan = state.plan(0, rows, None, policy, cpu_all)
    assert sorted(plan.cpu) == [3, 5] and not plan.copies
    assert [e for e, _, _ in plan.background] == [3]  # the higher-reuse one, at most one per access
    assert plan.background[0][2] is None and 3 not in plan.slot_of  # a free slot; this access reads the CPU result
    assert state.stats.copies[0] == 1 and state.stats.bytes_copied[0] == 10
    policy.observe_access(0, rows, None, 2)
    plan = state.plan(0, rows, None, policy, cpu_all)
    assert plan.hits == [3] and plan.cpu == [5]
    assert [e for e, _, _ in plan.background] == [5]  # the second slot was free
    state.check_invariants()
    slot5 = state.resident(0)[5]
    rows = ids(6)  # full: 6 evicts the lowest-priority resident not requested now (5: fewer tokens than 3)
    policy.observe_access(0, rows, None, 3)
    plan = state.plan(0, rows, None, policy, cpu_all)
    assert plan.cpu == [6] and plan.background == [(6, slot5, 5)]
    policy.gate_power, policy.decay = 0.0, 1.0
    rows = ids(*[7] * 1)  # 7's priority (one row) is below every resident's now: no eviction
    policy._score[0][[3, 6]] += 10.0
    policy.observe_access(0, rows, None, 4)
    plan = state.plan(0, rows, None, policy, cpu_all)
    assert plan.cpu == [7] and plan.background == []
    state.check_invariants()
