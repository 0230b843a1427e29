"""``adaptive`` retention: knobs, equivalence with a single candidate, and convergence to the better one."""

import numpy as np
import pytest

from oled_hf.offload.dispatch import Dispatcher
from oled_hf.offload.planner import CacheState
from oled_hf.offload.policies.adaptive import AdaptivePolicy
from oled_hf.offload.system import System, build_policy, parse_system


@pytest.mark.parametrize("knobs, message", [
    ({"candidates": "oled,fifo"}, "adaptive candidates='oled,fifo' is invalid: distinct names from oled, lru"),
    ({"half_life": 0}, "adaptive half_life=0 is invalid: must be a number > 0"),
    ({"margin": 1.5}, r"adaptive margin=1.5 is invalid: must be a number in \[0, 1\)"),
    ({"scope": "model"}, "adaptive scope='model' is invalid: must be one of layer, global"),
    ({"sample": 0}, "adaptive sample=0 is invalid: must be an integer >= 1"),
    ({"switch_cost": "free"}, "adaptive switch_cost='free' is invalid: must be one of none, transition"),
    ({"speed": 2}, "unknown adaptive knob.s.: speed; known: candidates, cost, half_life, margin, scope, sample, "
                   "switch_cost"),
])
def test_bad_knobs_are_one_line(knobs, message):
    system = System("adaptive", knobs={f"retention.{k}": v for k, v in knobs.items()})
    with pytest.raises(ValueError, match=message) as err:
        build_policy(system, 2, 8)
    assert "\n" not in str(err.value)


def test_grammar_names_it():
    assert parse_system("adaptive+cpu+reuse+adaptive").retention == "adaptive"


COPY = Dispatcher.for_mode("copy", None)


def _step(policy, state, experts, clock, dispatcher=COPY):
    """One access of layer 0 (one token per expert), as the controller makes it: observed, then planned."""
    ids = np.asarray(experts, dtype=np.int64).reshape(-1, 1)
    policy.observe_access(0, ids, np.ones(ids.shape), clock)
    return state.plan(0, ids, None, policy, dispatcher)


def _run(policy, accesses, caps, num_experts=8, dispatcher=COPY):
    state = CacheState(len(caps), num_experts, caps)
    for clock, ids in enumerate(accesses):
        _step(policy, state, ids, clock, dispatcher)
    return state.stats


def _frequency_trace(n=400, seed=0):
    """Two hot experts in most accesses, the rest one-shot noise: frequency keeps the hot ones."""
    rng = np.random.default_rng(seed)
    out = []
    for _t in range(n):
        hot = [e for e in (0, 1) if rng.random() < 0.7]
        out.append(hot + list(rng.choice(np.arange(2, 16), size=2, replace=False)))
    return out


def _recency_trace(n=400):
    """A pair used 100 times, then dead; then two other pairs alternate: recency holds both, frequency the dead one."""
    return [[0, 1]] * 100 + [[2, 3] if t % 2 else [4, 5] for t in range(n - 100)]


@pytest.mark.parametrize("make_trace, slots, winner, loser", [
    (_frequency_trace, 3, "lfu", "lru"),  # frequency wins
    (_recency_trace, 4, "lru", "lfu"),  # recency wins
])
def test_converges_to_the_policy_that_wins(make_trace, slots, winner, loser):
    trace = make_trace()
    misses = {n: sum(_run(build_policy(System(n), 1, 16), trace, [slots], 16).misses) for n in (winner, loser)}
    assert misses[winner] < misses[loser]
    policy = AdaptivePolicy(1, 16, candidates=f"{loser},{winner}", half_life=32)
    _run(policy, trace, [slots], 16)
    assert policy.chosen(0) == winner


def test_one_candidate_plans_as_it():
    trace = _frequency_trace(200)
    for name in ("oled", "lfu"):
        alone = _run(build_policy(System(name), 1, 16), trace, [4], 16)
        wrapped = _run(AdaptivePolicy(1, 16, candidates=name), trace, [4], 16)
        assert (alone.hits, alone.misses, alone.evictions) == (
            wrapped.hits, wrapped.misses, wrapped.evictions)


def test_shadows_run_when_called_or_at_the_next_plan():
    """The deferred half gives the same decisions whether the executor runs it or the next plan does."""
    trace = _frequency_trace(200)
    explicit = AdaptivePolicy(1, 16, candidates="lru,lfu", half_life=16)
    state = CacheState(1, 16, [3])
    ran = []
    for clock, ids in enumerate(trace):
        _step(explicit, state, ids, clock)
        ran.append(explicit.run_shadows())
        assert explicit.run_shadows() == 0  # nothing left pending
    assert ran == [1] * len(trace)  # the followed candidate is scored on the real plan
    implicit = AdaptivePolicy(1, 16, candidates="lru,lfu", half_life=16)
    stats = _run(implicit, trace, [3], 16)
    assert (stats.hits, stats.misses) == (state.stats.hits, state.stats.misses)
    assert implicit.chosen(0) == explicit.chosen(0) == "lfu" and implicit.switches == explicit.switches


@pytest.mark.parametrize("mode", ["copy", "cpu", "cpu+reuse"])
def test_time_cost_is_the_cost_models_access_time_over_all_resident(mode):
    """``_overhead_s`` is ``CostModel.access_time`` of the plan minus all-resident, plus its reuse copies."""
    from oled_hf.offload.costmodel import CostModel
    from oled_hf.offload.policies.adaptive import _ideal_s, _overhead_s

    cm = CostModel.h200_pcie5(2048, 512, kernel="grouped")
    dispatcher = Dispatcher.for_mode(mode, cm)
    policy = build_policy(System("oled"), 1, 32)
    state = CacheState(1, 32, [6])
    rng = np.random.default_rng(0)
    seen_copy = seen_cpu = False
    for clock in range(30):
        ids = rng.choice(12, size=(16, 2)).astype(np.int64)
        counts = np.bincount(ids.reshape(-1), minlength=32)
        policy.observe_access(0, ids, np.ones(ids.shape), clock, counts)
        plan = state.plan(0, ids, None, policy, dispatcher, counts)
        want = cm.access_time(counts[plan.hits], counts[[c[0] for c in plan.copies]], counts[plan.cpu])
        want += -cm.gpu_path_time(counts[counts > 0], counts[:0]) + len(plan.background) * cm.copy_time()
        assert _overhead_s(cm, plan, counts, _ideal_s(cm, counts)) == pytest.approx(want, rel=1e-9, abs=1e-12)
        seen_copy |= bool(plan.copies)
        seen_cpu |= bool(plan.cpu)
    assert seen_copy and (seen_cpu or mode == "copy")


def test_the_followed_candidate_is_scored_on_the_real_plan():
    """Its cost is what the real cache paid; a candidate left behind restarts from the real cache."""
    trace = _recency_trace(300)
    policy = AdaptivePolicy(1, 16, candidates="lfu,lru", half_life=16)
    state = CacheState(1, 16, [4])
    real = []
    for clock, ids in enumerate(trace):
        before = int(state.stats.misses[0] + state.stats.copies[0])
        followed = policy.chosen(0)
        _step(policy, state, ids, clock)
        cost = policy.cost[0].copy()
        policy.run_shadows()
        i = policy.names.index(followed)
        real.append(int(state.stats.misses[0] + state.stats.copies[0]) - before)
        assert policy.cost[0][i] == pytest.approx(cost[i] * policy.decay + real[-1])
        if policy.chosen(0) != followed:  # re-seeded: the shadow holds what the real cache holds
            assert policy._shadows[i].resident(0).keys() == state.resident(0).keys()
            policy._shadows[i].check_invariants()
    assert policy.switches >= 1 and policy.chosen(0) == "lru"


def test_copy_layer_from_copies_residency_not_stats():
    a, b = CacheState(2, 8, [3, 2]), CacheState(2, 8, [3, 2])
    policy = build_policy(System("lru"), 2, 8)
    for clock, ids in enumerate([[1, 2], [5], [6, 7], [0]]):
        _step(policy, a, ids, clock)
    b.plan(0, np.asarray([[3]]), None, policy, COPY)
    misses = b.stats.misses.copy()
    b.copy_layer_from(a, 0)
    assert b.resident(0).keys() == a.resident(0).keys() and list(b.stats.misses) == list(misses)
    b.check_invariants()
    with pytest.raises(ValueError, match="layer 1 has 2 slots here, 3 in the source"):
        b.copy_layer_from(CacheState(2, 8, [2, 3]), 1)


def test_a_prefetched_layer_scores_the_followed_candidate_on_its_shadow():
    """Prefetched experts are hits of the real plan that no shadow gets: they must not win the contest."""
    trace = _recency_trace(400)
    policy = AdaptivePolicy(1, 16, candidates="lfu,lru", half_life=16)
    state = CacheState(1, 16, [4])
    ran = []
    for clock, ids in enumerate(trace):
        state.admit(0, ids, policy)  # as the controller's prefetch does, before the plan
        policy.on_admitted(0, np.asarray(ids), clock)
        _step(policy, state, ids, clock)
        ran.append(policy.run_shadows())
    # the first copy outside a plan is access 100's (before: no plan seen yet, then [0, 1] resident):
    # from there both candidates are planned on their shadows, the followed one seeded from the real cache
    assert ran == [1] * 100 + [2] * (len(trace) - 100)
    assert policy.chosen(0) == "lru"  # as without the prefetch (the trace recency wins)


def test_a_prefetch_that_copies_nothing_keeps_the_real_plan_scoring():
    """The controller reports what it asked for; experts already resident change nothing."""
    policy = AdaptivePolicy(1, 16, candidates="lfu,lru")
    state = CacheState(1, 16, [4])
    ran = []
    for clock in range(20):
        ids = [0, 1]
        state.admit(0, ids, policy)
        policy.on_admitted(0, np.asarray(ids), clock)
        _step(policy, state, ids, clock)
        ran.append(policy.run_shadows())
    assert ran == [1] * 20 and not policy._outside[0]


@pytest.mark.parametrize("switch_cost, switches_at", [("transition", "above the gap"), ("none", "any lead")])
def test_a_switch_must_pay_for_its_transition(switch_cost, switches_at):
    """The newcomer's lead must exceed the copies the switch costs: what its shadow holds and the real cache lacks."""
    policy = AdaptivePolicy(1, 16, candidates="lru,lfu", margin=0.0, switch_cost=switch_cost)
    state = CacheState(1, 16, [4])
    _step(policy, state, [0, 1, 2, 3], 0)
    policy.run_shadows()
    lfu_shadow = policy._shadows[1]
    lfu_shadow.plan(0, np.asarray([[0], [1], [8], [9]]), None, policy.policies[1], COPY)
    gap = int((lfu_shadow.resident_mask(0) & ~state.resident_mask(0)).sum())
    assert gap == 2
    short = policy._pick(np.array([10.0, 10.0 - 2 * gap + 0.5]), 0, [0], 2.0)
    long = policy._pick(np.array([10.0, 10.0 - 2 * gap - 0.5]), 0, [0], 2.0)
    assert long == 1 and short == (0 if switches_at == "above the gap" else 1)
    assert policy.switches == (1 if switch_cost == "transition" else 2)
