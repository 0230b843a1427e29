"""The ``horizon`` policy (oled_hf/offload/policies/horizon.py): the learned chance of a reuse within the
cache's horizon, its admission floor and discount, the base policy's priority, knob errors."""

from __future__ import annotations

import numpy as np
import pytest

from oled_hf.offload.policies import make_policy
from oled_hf.offload.policies.horizon import HorizonPolicy


def ids_of(req):
    return np.asarray(req, dtype=np.int64).reshape(-1, 1)


def _cycle(p: HorizonPolicy, period: int, rounds: int) -> None:
    """Expert ``i % period`` at access ``i``: each expert's stack distance at its reuse is ``period - 1``."""
    for clock in range(period * rounds):
        p.observe_access(0, ids_of([clock % period]), None, clock)


def test_reuse_is_learned_from_the_horizon_of_the_slots():
    """A cyclic trace of 4 experts: with 4 slots every reuse comes at stack distance 3 (< 4), so the
    learned chance of the bin used tends to 1 and its reuse grows; with 2 slots every use fails
    (distance 3 >= 2) and the chance falls below the bin's prior centre."""
    wide, narrow = HorizonPolicy(1, 8, prior_n=1.0), HorizonPolicy(1, 8, prior_n=1.0)
    wide.set_capacities([4])
    narrow.set_capacities([2])
    _cycle(wide, 4, 40)
    _cycle(narrow, 4, 40)
    b = int(wide._bin(wide._usage[0][[3]])[0])  # the bin of a use just made (expert 3 was last)
    assert wide.hit_chance(0)[b] > 0.95
    assert narrow.hit_chance(0)[b] < 0.1 < wide._centre[b]
    assert wide.reuse_array(0)[0] > 10 * narrow.reuse_array(0)[0]
    # an untrained bin says what its prior centre says
    assert wide.hit_chance(0)[7] == pytest.approx(wide._centre[7])


def test_scale_widens_the_horizon_and_discount_scales_the_reuse():
    p = HorizonPolicy(1, 8, prior_n=1.0, scale=2.0)  # 2 slots x 2 = 4 > distance 3: reuses succeed
    p.set_capacities([2])
    _cycle(p, 4, 40)
    b = int(p._bin(p._usage[0][[3]])[0])
    assert p.hit_chance(0)[b] > 0.95
    d = HorizonPolicy(1, 8, prior_n=1.0, scale=2.0, discount=0.25)
    d.set_capacities([2])
    _cycle(d, 4, 40)
    np.testing.assert_allclose(d.reuse_array(0), 0.25 * p.reuse_array(0))


def test_admission_floor_refuses_experts_whose_reuse_chance_is_low():
    assert HorizonPolicy(1, 8).admission(0) is None  # floor 0: every miss admitted
    narrow, wide = HorizonPolicy(1, 8, prior_n=1.0, admit_min=0.5), HorizonPolicy(1, 8, prior_n=1.0, admit_min=0.5)
    narrow.set_capacities([2])
    wide.set_capacities([4])
    _cycle(narrow, 4, 40)  # every use fails at 2 slots
    _cycle(wide, 4, 40)  # every use succeeds at 4
    assert not narrow.admission(0)[:4].any()
    adm = wide.admission(0)
    assert adm[:4].all()
    assert not adm[4:].any()  # never used: bin 0, its untrained prior 1/16 is below the floor


def test_priority_is_the_base_policys_and_knob_errors_name_the_field():
    h, base = make_policy("horizon", 1, 8), make_policy("lru", 1, 8)
    h2 = HorizonPolicy(1, 8, base="lfu")
    lfu = make_policy("lfu", 1, 8)
    for clock, req in enumerate([[0, 1], [0, 2], [3]], start=1):
        for p in (h, base, h2, lfu):
            p.observe_access(0, ids_of(req), None, clock)
    np.testing.assert_array_equal(h.priority_array(0), base.priority_array(0))
    np.testing.assert_array_equal(h2.priority_array(0), lfu.priority_array(0))
    for knobs, msg in (({"base": "nope"}, "horizon base='nope' is unknown; allowed: lru, oled, value, lfu, score"),
                       ({"scale": 0}, "horizon scale=0 is invalid"),
                       ({"bins": 0}, "horizon bins=0 is invalid"),
                       ({"calib_decay": 1.0}, r"horizon calib_decay=1.0 is invalid: must be a number in \[0, 1\)"),
                       ({"admit_min": -1}, "horizon admit_min=-1 is invalid"),
                       ({"discount": 0}, "horizon discount=0 is invalid"),
                       ({"prior_n": 0}, "horizon prior_n=0 is invalid")):
        with pytest.raises(ValueError, match=msg):
            HorizonPolicy(1, 8, **knobs)
