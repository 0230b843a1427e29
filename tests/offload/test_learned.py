"""The ``learned`` retention part (oled_hf/offload/policies/learned.py): it learns online which experts come
back, keeps them where recency would not, is deterministic, and refuses bad knobs in one line."""

import numpy as np
import pytest

from oled_hf.offload.dispatch import Dispatcher
from oled_hf.offload.planner import CacheState
from oled_hf.offload.policies import make_policy
from oled_hf.offload.policies.learned import LearnedPolicy
from oled_hf.offload.system import parse_system
from oled_hf.sim.replay import replay
from oled_hf.sim.synthetic import synthetic_trace


def periodic(t: int) -> np.ndarray:
    """Access ``t`` of one layer of 48 experts: four of a pool of 40 in turn (each back after 10 accesses),
    plus expert 0 on every third access (back after 3)."""
    ids = [1 + (4 * t + j) % 40 for j in range(4)] + ([0] if t % 3 == 0 else [])
    return np.array(ids, dtype=np.int64).reshape(-1, 1)


def hits_on_expert_0(retention: str, accesses: int = 300) -> tuple[int, int]:
    """Pure caching at 5 slots: (hits of expert 0, its uses) in the second half of the run."""
    state = CacheState(1, 48, [5])
    policy = make_policy(retention, 1, 48)
    copy_all = Dispatcher(None, "off")
    hits = uses = 0
    for t in range(accesses):
        ids = periodic(t)
        counts = np.bincount(ids.reshape(-1), minlength=48)
        policy.observe_access(0, ids, None, t, counts)
        plan = state.plan(0, ids, None, policy, copy_all, counts)
        if t >= accesses // 2 and t % 3 == 0:
            uses += 1
            hits += 0 in plan.hits
    state.check_invariants()
    return hits, uses


def test_learns_to_keep_the_expert_that_comes_back_where_recency_evicts_it():
    """Each access brings four new experts into five slots: LRU has always evicted expert 0 by its next use.
    The predictor learns from its labels that expert 0 at age 1-2 comes back and the others do not."""
    lru_hits, uses = hits_on_expert_0("lru")
    learned_hits, _ = hits_on_expert_0("learned")
    assert lru_hits == 0
    assert learned_hits >= 0.9 * uses
    p = LearnedPolicy(1, 48)
    for t in range(150):
        ids = periodic(t)
        p.observe_access(0, ids, None, t, np.bincount(ids.reshape(-1), minlength=48))
    prob = p.probability(0)  # after access 149: expert 0 last used at 147, back at 150
    recent = np.unique(np.concatenate([periodic(t).reshape(-1) for t in range(145, 149)]))
    recent = recent[recent != 0]  # used 1-4 accesses ago, back only 10 accesses after their use
    assert prob[0] > 0.8 and prob[recent].max() < 0.5
    assert p.priority_array(0)[0] > p.priority_array(0)[recent].max()


def test_plans_are_deterministic_and_differ_from_oled():
    trace = synthetic_trace(num_layers=2, num_experts=64, top_k=4, block_length=16, num_blocks=4, seed=3)
    system = parse_system("learned+cpu+reuse+adaptive")
    a = replay(trace, "learned", 16, system=system, planner_s=0.0)
    b = replay(trace, "learned", 16, system=system, planner_s=0.0)
    assert (a.hits, a.copies, a.cpu_expert_tokens, a.capacities) == (b.hits, b.copies, b.cpu_expert_tokens,
                                                                       b.capacities)
    oled = replay(trace, "oled", 16, system=parse_system("oled+cpu+reuse+adaptive"), planner_s=0.0)
    assert (a.hits, a.copies) != (oled.hits, oled.copies)


@pytest.mark.parametrize("knobs, message", [
    ({"horizon": 0}, r"learned horizon=0 is invalid: must be an integer in \[1, 64\]"),
    ({"horizon": 65}, r"learned horizon=65 is invalid"),
    ({"horizon": 2.5}, r"learned horizon=2.5 is invalid"),
    ({"horizon": True}, r"learned horizon=True is invalid"),
    ({"rate": 0.0}, r"learned rate=0.0 is invalid: must be a number in \(0, 10\]"),
    ({"rate": -1}, r"learned rate=-1 is invalid"),
    ({"rate": 11}, r"learned rate=11 is invalid"),
    ({"rate": "fast"}, r"learned rate='fast' is invalid"),
    ({"window": 8}, r"retention 'learned' has no knob\(s\) window; known: horizon, rate$"),
])
def test_bad_knobs_are_one_line_naming_what_is_allowed(knobs, message):
    with pytest.raises(ValueError, match=message) as err:
        LearnedPolicy(2, 8, **knobs)
    assert "\n" not in str(err.value)


def test_bad_knob_in_a_system_changes_nothing_already_running():
    """A replay asked for with a bad knob fails before it starts; another run's results are untouched."""
    trace = synthetic_trace(num_layers=2, num_experts=32, top_k=4, block_length=8, num_blocks=2, seed=1)
    good = replay(trace, "learned", 8, system=parse_system("learned+cpu+reuse+adaptive"), planner_s=0.0)
    with pytest.raises(ValueError, match="learned rate=0 is invalid"):
        replay(trace, "learned", 8, system=parse_system("learned+cpu+reuse+adaptive").with_knobs(retention__rate=0),
               planner_s=0.0)
    again = replay(trace, "learned", 8, system=parse_system("learned+cpu+reuse+adaptive"), planner_s=0.0)
    assert (good.hits, good.copies) == (again.hits, again.copies)
