"""Policies: registry, per-policy semantics, and OLED's advantage where confidence matters."""

import numpy as np
import pytest
import torch
from oled_hf.modeling.events import IterationEvent, IterationObserver

from oled_hf.offload.config import OffloadConfig
from oled_hf.offload.policies import available_policies, make_policy
from oled_hf.offload.policies.oled import COMMITTED, CONFIDENT, DECODED, EDITED, FRESH, UNSURE
from oled_hf.sim.replay import replay
from oled_hf.sim.synthetic import synthetic_trace


def event(masked, conf, committed, block=0, it=0):
    m = torch.tensor([masked], dtype=torch.bool)
    return IterationEvent(block, it, m, torch.tensor([conf], dtype=torch.float32),
                          torch.tensor([committed], dtype=torch.bool), torch.zeros_like(m, dtype=torch.long))


def test_registry_and_config_knobs():
    known = available_policies()  # sorted; research policies join the registry over time
    assert known == sorted(known)
    core = ["lfu", "lru", "moe-infinity", "oled", "prefetch", "score", "static", "tide"]  # (oracles need a trace)
    assert set(core) <= set(known)
    with pytest.raises(ValueError, match="policy='nope' is unknown; known policies: " + ", ".join(known) + "$"):
        make_policy("nope", 2, 8)
    cfg = OffloadConfig(cache_size=2, tide_interval=7, static_warmup_iterations=3, oled_decay=0.25)
    assert make_policy("tide", 2, 8, cfg).interval == 7
    assert make_policy("static", 2, 8, cfg).warmup_iterations == 3
    assert make_policy("oled", 2, 8, cfg).decay == 0.25
    for name in core:
        p = make_policy(name, 2, 8)
        assert isinstance(p, IterationObserver) and p.priority(0).shape == (8,)
        assert p.predicted_reuse(0).shape == (8,) and p.admits(0, 3)


def test_lru_and_lfu_order():
    lru, lfu = make_policy("lru", 1, 6), make_policy("lfu", 1, 6)
    for clock, req in enumerate([[0, 1], [0, 2], [0, 3], [4, 1]], start=1):
        for p in (lru, lfu):
            p.observe_access(0, np.array(req).reshape(-1, 1), None, clock)
    assert lru.priority(0).argsort(descending=True)[:2].tolist() in ([4, 1], [1, 4])
    assert lru.priority_array(0)[0] < lru.priority_array(0)[1]
    assert lfu.priority_array(0).argmax() == 0 and lfu.priority_array(0)[1] > lfu.priority_array(0)[2]


def test_static_freezes_after_warmup():
    p = make_policy("static", 1, 8, OffloadConfig(cache_size=2, static_warmup_iterations=2))
    p.set_capacities([2])
    ev = event([True], [0.5], [False])
    for req in ([0, 1, 1, 2], [1, 2, 2, 2]):
        assert p.admission(0) is None
        p.observe_access(0, np.array(req).reshape(-1, 1), None, 1)
        p.on_iteration(ev)
    assert p.admission(0).nonzero()[0].tolist() == [1, 2]  # top-2 by token frequency
    p.observe_access(0, np.array([5, 5, 5, 5, 5]).reshape(-1, 1), None, 3)
    assert p.admission(0).nonzero()[0].tolist() == [1, 2] and not p.admits(0, 5)


def test_tide_reselects_every_interval():
    p = make_policy("tide", 1, 8, OffloadConfig(cache_size=2, tide_interval=2))
    p.set_capacities([2])
    p.on_block_start(0, torch.zeros(1, 4))
    p.observe_access(0, np.array([1, 1, 2, 3]).reshape(-1, 1), None, 1)  # iteration 0: reselect
    assert p.admission(0).nonzero()[0].tolist() == [1, 2]
    p.on_iteration(event([True] * 4, [0.1] * 4, [False] * 4, it=0))
    p.observe_access(0, np.array([5, 5, 6, 6]).reshape(-1, 1), None, 2)  # iteration 1: no change
    assert p.admission(0).nonzero()[0].tolist() == [1, 2]
    p.on_iteration(event([True] * 4, [0.1] * 4, [False] * 4, it=1))
    p.observe_access(0, np.array([5, 5, 6, 7]).reshape(-1, 1), None, 3)  # iteration 2: reselect
    assert p.admission(0).nonzero()[0].tolist() == [5, 6]


def test_oled_classes_and_priorities():
    p = make_policy("oled", 1, 16)
    p.freq_weight = 0.0  # the stability rule alone (the slow popularity term is tested below)
    cls = p.classify(np.array([0, 1, 1, 1, 1]), np.array([1.0, 0.95, 0.95, 0.5, 0.05]),
                     np.array([0, 1, 0, 0, 0]))
    assert cls.tolist() == [DECODED, COMMITTED, CONFIDENT, UNSURE + 2, UNSURE]
    p.on_block_start(0, torch.zeros(1, 4))
    p.on_iteration(event([False, True, True, True], [1.0, 0.99, 0.1, 0.1], [False, True, False, False]))
    # rows 0, 1 settled (experts 0, 1); rows 2, 3 unsure (experts 2, 3); equal gate weights
    p.observe_access(0, np.array([[0], [1], [2], [3]]), np.ones((4, 1)), 1)
    prio = p.priority_array(0)
    assert min(prio[0], prio[1]) > 2 * max(prio[2], prio[3])
    assert p.reuse_array(0)[0] > p.reuse_array(0)[2]
    before = prio.copy()
    p.on_block_start(1, torch.zeros(1, 4))
    assert np.allclose(p.priority_array(0), before * p.block_decay)
    p.observe_access(0, np.array([[9], [9], [10]]), None, 2)  # 3 rows != 4: prefill-like, stable
    assert p.priority_array(0)[9] > p.priority_array(0)[10] > 0


def test_oled_popularity_survives_block_boundaries():
    p = make_policy("oled", 1, 16)
    p.freq_weight = 1.0  # the slow term is off by default since reuse copies (see the config)
    for block in range(4):  # expert 3 is used by every block, expert 7 only by the last one
        p.on_block_start(block, torch.zeros(1, 4))
        ids = np.array([[3], [3], [block + 4], [block + 4]])
        p.observe_access(0, ids, np.ones((4, 1)), block)
        p.on_block_end(block, torch.zeros(1, 4))
    p.on_block_start(4, torch.zeros(1, 4))
    prio = p.priority_array(0).copy()
    assert prio[3] > prio[7] > prio[4]
    p.freq_weight = 0.0
    alone = p.priority_array(0)
    assert prio[3] - prio[7] > 10 * (alone[3] - alone[7])  # stability alone nearly forgets popularity


def test_oled_calibrates_stability_from_persistence():
    p = make_policy("oled", 1, 64)
    p.on_block_start(0, torch.zeros(1, 8))
    rng = np.random.default_rng(0)
    routes = rng.permutation(64)[:16].reshape(8, 2)
    for it in range(40):
        p.on_iteration(event([True] * 8, [0.95] * 8, [False] * 8, it=it))  # "confident" ...
        routes = np.stack([rng.permutation(64)[:2] for _ in range(8)])  # ... but routes change
        p.observe_access(0, routes, None, it + 1)
    assert p.stability(0)[CONFIDENT] < 0.5 < p.prior[CONFIDENT]
    assert p.stability(0)[FRESH] == pytest.approx(p.prior[FRESH], abs=0.1)


def test_oled_edited_tokens_are_unsettled_and_calibrated_apart():
    """LLaDA2.1 edits: an edited row gets its own class (prior below decoded), whose persistence is
    measured separately; here decoded rows keep their routes and edited rows do not."""
    p = make_policy("oled", 1, 64)
    cls = p.classify(np.array([0, 0, 1]), np.array([1.0, 1.0, 0.5]), np.array([0, 0, 0]), np.array([0, 1, 0]))
    assert cls.tolist() == [DECODED, EDITED, UNSURE + 2]
    assert p.prior[EDITED] < p.prior[DECODED]
    p.on_block_start(0, torch.zeros(1, 8))
    rng = np.random.default_rng(0)
    kept = rng.permutation(64)[:8].reshape(4, 2)
    for it in range(40):
        ev = event([False] * 8, [1.0] * 8, [False] * 8, it=it)
        ev.edited = torch.tensor([[False] * 4 + [True] * 4])
        p.on_iteration(ev)
        moving = np.stack([rng.permutation(64)[:2] for _ in range(4)])
        p.observe_access(0, np.concatenate([kept, moving]), None, it + 1)
    s = p.stability(0)
    assert s[DECODED] > 0.95 and s[EDITED] < 0.3 < p.prior[EDITED]
    assert p.priority_array(0)[kept].min() > np.sort(p.priority_array(0))[-9]  # settled experts rank top


def test_oled_usage_reuse_is_the_usage_ema_run_length_and_leaves_the_ranking():
    """Rule 8: reuse=usage amortises copies over the usage EMA's run length u / (1 - u), not over
    the one-iteration rule (a settled route there has reuse at the cap); the priorities are unchanged."""
    from oled_hf.offload.policies.oled import OledPolicy

    conf, usage = OledPolicy(1, 8), OledPolicy(1, 8, reuse="usage", usage_decay=0.5)
    for p in (conf, usage):
        p.on_block_start(0, torch.zeros(1, 2))
        p.on_iteration(event([False, False], [1.0, 1.0], [False, False]))  # two settled rows
        for clock in range(3):  # expert 0 used three times, expert 1 only in the last access
            p.observe_access(0, np.array([[0], [1 if clock == 2 else 0]]), np.ones((2, 1)), clock)
    np.testing.assert_array_equal(conf.priority_array(0), usage.priority_array(0))
    u0, u1 = 1 - 0.5 ** 3, 0.5  # usage EMA after 3 uses / 1 use, decay 0.5
    assert usage.reuse_array(0)[[0, 1, 2]] == pytest.approx([u0 / (1 - u0), u1 / (1 - u1), 0.0])
    assert usage.reuse_of(0, np.array([1, 0])) == pytest.approx([u1 / (1 - u1), u0 / (1 - u0)])
    assert usage.reuse_inputs(0)[0] == 1  # the planner reads the row, not rule 4's inputs
    from oled_hf.offload.policies.base import MAX_REUSE

    assert conf.reuse_of(0, np.array([0]))[0] == MAX_REUSE > 4 * usage.reuse_of(0, np.array([0]))[0]  # the cap
    with pytest.raises(ValueError, match=r"oled reuse='horizon' is unknown; allowed: confidence, usage"):
        OledPolicy(1, 8, reuse="horizon")
    with pytest.raises(ValueError, match=r"oled usage_decay=1.0 is invalid: must be a number in \[0, 1\)"):
        OledPolicy(1, 8, reuse="usage", usage_decay=1.0)


def test_oled_usage_reuse_replays_through_the_system_knobs():
    """The report's oled grid setting (0 reuse copies: the amortised split, over the usage reuse) runs
    as a system; it copies differently from the preset, and its knobs reach the policy."""
    import argparse

    from oled_hf.offload.system import parse_system
    from oled_hf.sim.hardware import cost_model_from_args
    from oled_hf.sim.report import SYSTEMS

    grid = next(s for s in SYSTEMS if s.name == "oled").grid
    setting = next(g for g in grid if g.get("retention.reuse") == "usage")
    trace = synthetic_trace(num_layers=2, num_experts=32, top_k=4, block_length=8, num_blocks=3, seed=1)
    system = parse_system("oled").with_knobs(**{k.replace(".", "__", 1): v for k, v in setting.items()})
    assert system.dispatch == "cpu+reuse" and system.knobs["dispatch.reuse_copies"] == 0
    cost = cost_model_from_args(trace, argparse.Namespace(as_model="llada2.0-mini"))
    usage = replay(trace, "oled", 8, system=system, cost_model=cost)
    preset = replay(trace, "oled", 8, system=parse_system("oled"), cost_model=cost)
    assert usage.hits + usage.misses == preset.hits + preset.misses
    assert (usage.copies, usage.cpu_expert_tokens) != (preset.copies, preset.cpu_expert_tokens)


@pytest.mark.parametrize("cpu", ["off", "auto"])
def test_oled_beats_lru_when_confident_tokens_keep_routes(cpu):
    gains = []
    for seed in range(3):
        trace = synthetic_trace(num_layers=2, num_experts=128, top_k=4, block_length=16, num_blocks=3,
                                popularity_scale=0.0, stable_keep=1.0, confident_keep=1.0, unsure_keep=0.0,
                                seed=seed)
        oled = replay(trace, "oled", 32, layer_adaptive=False, cpu_compute=cpu)
        lru = replay(trace, "lru", 32, layer_adaptive=False, cpu_compute=cpu)
        gains.append(oled.hit_rate - lru.hit_rate)
    assert min(gains) > 0 and np.mean(gains) > 0.01


def test_score_policy_ranks_by_decayed_gate_weight():
    """HybriMoE's cache rule: a heavily weighted expert outranks one many tokens route to lightly."""
    p = make_policy("score", 1, 4)
    ids = np.array([[0, 1], [0, 1], [0, 2]])
    w = np.array([[0.1, 0.9], [0.1, 0.9], [0.1, 0.9]], dtype=np.float32)
    p.observe_access(0, ids, w, 1)
    prio = p.priority_array(0)
    assert prio[1] > prio[0] > 0 and prio[3] == 0  # expert 0: 3 tokens x 0.1; expert 1: 2 x 0.9
    p.observe_access(0, np.array([[3, 2]]), np.array([[0.5, 0.5]], dtype=np.float32), 2)
    assert p.priority_array(0)[1] == pytest.approx(0.7 * 1.8)


def test_static_profile_fixes_the_placement_from_the_start():
    prof = np.zeros((1, 8))
    prof[0, [5, 6]] = [10, 20]
    p = make_policy("static", 1, 8)
    from oled_hf.offload.policies.static import StaticPolicy

    p = StaticPolicy(1, 8, profile=prof)
    p.set_capacities([2])
    assert p.admission(0).nonzero()[0].tolist() == [5, 6]  # before any access or iteration
    with pytest.raises(ValueError, match=r"static profile has shape \(2, 8\), expected"):
        StaticPolicy(1, 8, profile=np.zeros((2, 8)))


def test_prefetchers_are_a_separate_part():
    from oled_hf.offload.policies.prefetch import make_prefetcher

    gate = make_prefetcher("gate", 2, 8, limit=2)
    assert gate.prefetch_for(1, np.array([0, 3, 1, 0, 5, 0, 0, 0]), 4).tolist() == [4, 1]
    capped = make_prefetcher("gate-capped", 2, 8)
    assert capped.prefetch_for(1, np.array([0, 3, 1, 0, 5, 0, 0, 0]), 4, budget=1).tolist() == [4]
    assert capped.demand_first and not gate.demand_first
    assert make_prefetcher("none", 2, 8) is None
    with pytest.raises(ValueError, match="prefetch='x' is unknown; allowed: none, gate, gate-capped, previous, matrix"):
        make_prefetcher("x", 2, 8)


def test_previous_prefetcher_copies_what_the_layer_used_last_and_the_cache_lacks():
    """Layer 1's last access routed 3, 1, 5 and 2 tokens to experts 1, 2, 4 and 6; 4 is resident: the budget goes to
    the others, most tokens first (ties: lower id), at most the budget and the capacity."""
    from oled_hf.offload.policies.prefetch import make_prefetcher

    prev = make_prefetcher("previous", 2, 8)
    assert prev.capped and prev.demand_first and not prev.uses_predicted_routes
    prev.observe_access(1, np.array([0, 3, 1, 0, 5, 0, 2, 0]), clock=1)
    prev.observe_access(0, np.array([9, 0, 0, 0, 0, 0, 0, 0]), clock=2)  # another layer: not layer 1's
    resident = np.zeros(8, dtype=bool)
    resident[4] = True
    assert prev.prefetch_for(1, None, 4, budget=2, resident=resident).tolist() == [1, 6]
    assert prev.prefetch_for(1, None, 2, budget=None, resident=resident).tolist() == [1, 6]
    assert prev.prefetch_for(1, None, 8, budget=8).tolist() == [4, 1, 6, 2]  # no residency known: all of them
    assert prev.prefetch_for(1, None, 8, budget=0, resident=resident).tolist() == []
