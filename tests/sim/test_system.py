"""A system is a composition of parts: the grammar, presets, and 'same parts, same plan'."""

import hashlib

import numpy as np
import pytest

from oled_hf.offload.config import KNOWN_POLICIES, OffloadConfig
from oled_hf.offload.controller import CacheController, build_controller
from oled_hf.offload.costmodel import CostModel
from oled_hf.offload.system import (
    PRESET_KNOBS,
    SYSTEM_PRESETS,
    System,
    parse_system,
    resolve_system,
    spelling,
    system_of_legacy,
)
from oled_hf.offload.trace import OP_BLOCK_END, OP_FORWARD
from oled_hf.sim.replay import replay
from oled_hf.sim.synthetic import synthetic_trace
from tests.systems import legacy_config

CM = CostModel.h200_pcie5(512, 128)
TRACE = synthetic_trace(num_layers=3, num_experts=64, top_k=8, block_length=16, num_blocks=3, num_sequences=2,
                        hidden_size=512, moe_intermediate_size=128, seed=5)


def _digest(ctrl: CacheController) -> str:
    h = hashlib.sha256()
    for op, idx in TRACE.ops():
        if op == OP_FORWARD:
            ctrl.begin_forward()
            ids, weights = TRACE.routing(idx)
            for layer in range(TRACE.num_layers):
                p = ctrl.plan(layer, np.ascontiguousarray(ids[layer]), np.ascontiguousarray(weights[layer]))
                h.update(repr((p.hits, p.copies, p.cpu, p.background, sorted(p.slot_of.items()))).encode())
        else:
            TRACE.deliver(ctrl, op, idx)
        if op == OP_BLOCK_END:
            h.update(repr(list(ctrl.capacities)).encode())
    h.update(repr(ctrl.stats.to_dict(per_layer=True)).encode())
    return h.hexdigest()[:16]


def test_grammar_and_presets():
    assert parse_system("lru+cpu+reuse+adaptive") == System("lru", "none", "cpu+reuse", "adaptive")
    assert parse_system("moe-infinity+matrix+cpu").parts == "moe-infinity+matrix+cpu+uniform"
    assert parse_system("lru").parts == "lru+none+copy+uniform" == parse_system("mixtral-offloading").parts
    assert parse_system("oled").parts == "oled+none+cpu+reuse+adaptive"
    for name, text in SYSTEM_PRESETS.items():
        assert parse_system(name).parts == parse_system(text).parts
        assert parse_system(name).knobs == PRESET_KNOBS.get(name, {})
    # the oled preset's dispatcher models host-DRAM sharing; its legacy config builds the same system
    assert parse_system("oled").knobs == {"dispatch.shared_dram": True} == system_of_legacy("oled").knobs
    assert parse_system("oled+cpu+reuse+adaptive").knobs == {}
    with pytest.raises(ValueError, match=r"unknown part 'gpu'; expected RETENTION\[\+PREFETCH\].*"
                                         r"DISPATCH one of copy, cpu, cpu\+reuse"):
        parse_system("lru+gpu")
    with pytest.raises(ValueError, match="the first part must be a retention policy"):
        parse_system("cpu+lru")
    with pytest.raises(ValueError, match="'reuse' follows 'cpu'"):
        parse_system("lru+reuse")
    with pytest.raises(ValueError, match="part 'gate' .prefetch. is repeated or out of order"):
        parse_system("lru+cpu+gate")


@pytest.mark.parametrize("policy, cpu, adaptive", [
    ("oled", "on", True), ("lru", "off", False), ("tide", "on", True), ("static", "on", False), ("lfu", "off", True),
    ("oled", "off", False)])
def test_same_parts_give_the_same_plan_whatever_the_name(policy, cpu, adaptive):
    """The legacy config path (what live runs build), the parts string and a preset plan identically."""
    config = legacy_config(cache_size=12, policy=policy, cpu_compute=cpu, layer_adaptive=adaptive)
    legacy = _digest(CacheController(config, 3, 64, CM))
    system = system_of_legacy(policy, cpu, adaptive)
    assert _digest(build_controller(config, system, 3, 64, CM)) == legacy
    assert _digest(build_controller(config, parse_system(system.parts), 3, 64, CM)) == legacy
    if (policy, cpu, adaptive) == ("oled", "on", True):
        assert _digest(build_controller(config, parse_system("oled"), 3, 64, CM)) == legacy


def test_reuse_copies_are_a_dispatch_part_any_policy_can_use():
    config = OffloadConfig(cache_size=12)
    plain = build_controller(config, parse_system("lru+cpu+adaptive"), 3, 64, CM)
    full = build_controller(config, parse_system("lru+cpu+reuse+adaptive"), 3, 64, CM)
    assert _digest(plain) != _digest(full)
    assert full.dispatcher.mode == "cpu+reuse" and full.dispatcher.reuse_copies == 2
    assert full.stats.total("copies") > 0


def test_replay_counters_equal_across_names():
    a = replay(TRACE, "x", 12, system="oled", cost_model=CM, planner_s=0.0)
    b = replay(TRACE, "y", 12, system="oled+cpu+reuse+adaptive", cost_model=CM, planner_s=0.0)
    c = replay(TRACE, "oled", 12, cpu_compute="on", layer_adaptive=True, cost_model=CM, planner_s=0.0)
    for r in (b, c):
        assert (r.hits, r.misses, r.copies, r.cpu_expert_tokens, r.sim_time_s) == (
            a.hits, a.misses, a.copies, a.cpu_expert_tokens, a.sim_time_s)
    assert a.system == c.system == "oled+none+cpu+reuse+adaptive"


def test_a_believed_cost_model_changes_decisions_not_the_clock():
    truth = replay(TRACE, "x", 12, system="lru+cpu+uniform", cost_model=CM, planner_s=0.0)
    wrong = replay(TRACE, "x", 12, system="lru+cpu+uniform", cost_model=CM, planner_s=0.0,
                   believed=CM.believed(cpu_scale=4.0))
    assert wrong.cpu_expert_tokens > truth.cpu_expert_tokens
    assert wrong.full_time_s == truth.full_time_s


@pytest.mark.parametrize("policy, cpu, adaptive", [("oled", "on", True), ("lru", "off", False), ("tide", "auto", True)])
def test_resolved_system_is_what_the_controller_builds(policy, cpu, adaptive):
    """The controller builds from ``config.resolved_system()``: a legacy config and its system string plan alike."""
    legacy = CacheController(legacy_config(cache_size=12, policy=policy, cpu_compute=cpu, layer_adaptive=adaptive),
                             3, 64, CM)
    parts = system_of_legacy(policy, cpu, adaptive).parts
    assert legacy.system.parts == parts
    named = CacheController(legacy_config(cache_size=12, cpu_compute=cpu, system=parts, layer_adaptive=adaptive),
                            3, 64, CM)
    assert named.system.parts == parts and (named.allocator is not None) == adaptive
    assert _digest(named) == _digest(legacy)


@pytest.mark.parametrize("text", ["lru+cpu+reuse+adaptive", "lfu+cpu", "score+cpu+adaptive", "lru-full", "tide"])
def test_a_config_system_plans_as_build_controller(text):
    """``OffloadConfig(system=...)`` (what live runs use) and replay's ``build_controller`` give the same plans."""
    config = OffloadConfig(cache_size=12, system=text)
    ctrl = CacheController(config, 3, 64, CM)
    assert ctrl.system == parse_system(text)
    assert ctrl.dispatcher.mode == parse_system(text).dispatch
    assert (ctrl.allocator is not None) == parse_system(text).layer_adaptive
    assert _digest(ctrl) == _digest(build_controller(OffloadConfig(cache_size=12), parse_system(text), 3, 64, CM))


def test_config_reuse_knobs_are_the_dispatch_parts_knobs():
    """``oled_background_copies``/``_min_reuse`` tune a ``cpu+reuse`` dispatch whatever its retention."""
    base = dict(cache_size=12, system="lru+cpu+reuse+adaptive")
    assert OffloadConfig(**base).resolved_system().knobs == {}
    tuned = OffloadConfig(**base, oled_background_copies=4, oled_background_min_reuse=0.5).resolved_system()
    assert tuned.knobs == {"dispatch.reuse_copies": 4, "dispatch.reuse_min": 0.5}
    ctrl = CacheController(OffloadConfig(**base, oled_background_copies=4), 3, 64, CM)
    assert (ctrl.dispatcher.reuse_copies, ctrl.dispatcher.reuse_min) == (4, 1.0)
    assert OffloadConfig(**base, oled_background_copies=0).resolved_system().dispatch == "cpu"
    assert OffloadConfig(**base, cpu_compute="off").resolved_system().dispatch == "copy"  # a CPU-only device
    assert OffloadConfig(**base).resolved_system(cpu_compute="off").dispatch == "copy"  # what the runtime passes
    assert OffloadConfig(cache_size=12, system="lru+cpu", oled_background_copies=4).resolved_system().knobs == {}


@pytest.mark.parametrize("policy", KNOWN_POLICIES)
@pytest.mark.parametrize("cpu", ["auto", "on", "off"])
@pytest.mark.parametrize("adaptive", [True, False])
def test_every_alias_has_a_system_spelling_that_resolves_alike(policy, cpu, adaptive):
    """The deprecated ``policy``/``layer_adaptive`` aliases resolve (in ``resolve_system``) to the very
    System their ``system=`` spelling does, knobs included, whatever ``cpu_compute`` and the reuse knobs."""
    for copies, min_reuse in ((2, 1.0), (0, 1.0), (4, 0.5)):
        knobs = dict(cpu_compute=cpu, reuse_copies=copies, reuse_min=min_reuse)
        alias = resolve_system(None, policy=policy, layer_adaptive=adaptive, **knobs)
        named = spelling(resolve_system(None, policy=policy, layer_adaptive=adaptive))
        assert resolve_system(named, **knobs) == alias, (named, knobs)
    config = legacy_config(cache_size=12, policy=policy, cpu_compute=cpu, layer_adaptive=adaptive)
    assert config.resolved_system() == resolve_system(None, policy=policy, cpu_compute=cpu, layer_adaptive=adaptive)
    assert system_of_legacy(policy, cpu, adaptive) == config.resolved_system()


@pytest.mark.parametrize("policy, cpu, adaptive", [("lru", "auto", True), ("oled", "on", False),
                                                   ("tide", "off", False)])
def test_an_alias_and_its_spelling_plan_alike(policy, cpu, adaptive):
    legacy = legacy_config(cache_size=12, policy=policy, cpu_compute=cpu, layer_adaptive=adaptive)
    named = spelling(resolve_system(None, policy=policy, layer_adaptive=adaptive))
    assert _digest(CacheController(legacy, 3, 64, CM)) == _digest(
        CacheController(OffloadConfig(cache_size=12, system=named, cpu_compute=cpu), 3, 64, CM))


def test_resolve_system_refuses_an_unknown_policy_alias():
    from oled_hf.offload.system import LEGACY_POLICIES

    assert LEGACY_POLICIES == KNOWN_POLICIES
    with pytest.raises(ValueError, match=r"^policy='x' is unknown; known policies: lfu, lru, moe-infinity, oled, "):
        resolve_system(None, policy="x")


def test_build_controller_takes_the_systems_retention_knobs_over_the_configs():
    """Without the old ``legacy_config_fields`` bridge: a handed System's knobs win, the config's fill in."""
    config = OffloadConfig(cache_size=12, tide_interval=4, static_warmup_iterations=3)
    tuned = build_controller(config, parse_system("tide+cpu").with_knobs(retention__interval=7), 3, 64, CM)
    assert tuned.policy.interval == 7
    assert build_controller(config, parse_system("tide+cpu"), 3, 64, CM).policy.interval == 4
    assert build_controller(config, parse_system("static+cpu"), 3, 64, CM).policy.warmup_iterations == 3
    # the config's own name is ignored: a config naming lfu runs the handed system
    assert build_controller(OffloadConfig(cache_size=12, system="lfu"), parse_system("lru"), 3, 64, CM
                            ).system.retention == "lru"


def test_a_dispatcher_without_a_system_makes_no_reuse_copies():
    """The legacy bridge is gone: a bare ``Dispatcher`` is the ``cpu`` dispatch, reuse copies are asked for."""
    from oled_hf.offload.dispatch import Dispatcher

    assert Dispatcher(CM, "on").mode == "cpu" and Dispatcher(CM, "on").reuse_copies == 0
    assert not hasattr(Dispatcher, "bind_legacy")
    with pytest.raises(ValueError, match="reuse_copies=None is invalid: must be an integer >= 0"):
        Dispatcher(CM, "on", reuse_copies=None)


def test_the_default_preset_is_what_no_system_runs():
    """``default`` names the system ``OffloadConfig()`` runs (learned retention with oled's dispatch and
    allocation); ``oled`` stays the paper's method; ``policy="oled"`` is an alias of ``system="oled"``."""
    from oled_hf.offload.config import OffloadConfig
    from oled_hf.offload.system import DEFAULT_SYSTEM, resolve_system

    default = parse_system("default")
    assert DEFAULT_SYSTEM == "default" and default.parts == "learned+none+cpu+reuse+adaptive"
    assert resolve_system(None) == default == OffloadConfig(cache_size=4).resolved_system()
    assert parse_system("oled").retention == "oled" and resolve_system(None, policy="oled") == parse_system("oled")
    assert OffloadConfig(cache_size=4, cpu_compute="off").resolved_system().parts == "learned+none+copy+adaptive"


def test_trace_replay_and_benchmark_take_the_default_preset(tiny_path, tmp_path, capsys):
    import json

    from oled_hf.cli.main import main
    from oled_hf.sim.synthetic import synthetic_trace

    t = synthetic_trace(num_layers=2, num_experts=16, top_k=2, block_length=8, num_blocks=2, seed=1)
    path = tmp_path / "t.trace"
    t.save(str(path))
    assert main(["trace", "replay", str(path), "--cache-size", "4", "--system", "default", "oled"]) == 0
    out = capsys.readouterr().out
    assert "default" in out and "oled" in out
    assert main(["benchmark", "--model", str(tiny_path), "--cache-size", "6", "--cpu-compute", "on", "--system",
                 "default", "--json", "--max-new-tokens", "8", "--block-length", "8", "--runs", "1",
                 "--warmup-runs", "0", "--prompt", "hi"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows[1]["system"] == "learned+none+cpu+reuse+adaptive" and rows[1]["same_tokens"]
