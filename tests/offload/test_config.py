"""OffloadConfig: validation messages, JSON round trip, slot resolution against the model."""

import dataclasses
import math

import pytest

from oled_hf.offload.config import OffloadConfig
from oled_hf.offload.system import parse_system
from tests.systems import legacy_config


def test_needs_exactly_one_budget():
    with pytest.raises(ValueError, match="exactly one budget: cache_size .*, cache_ratio .* or max_gpu_memory .*"
                                         "got neither"):
        OffloadConfig()
    with pytest.raises(ValueError, match=r"got both \(cache_size=4, cache_ratio=0.5\)"):
        OffloadConfig(cache_size=4, cache_ratio=0.5)
    with pytest.raises(ValueError, match=r"got both \(cache_ratio='auto', max_gpu_memory='20GiB'\)"):
        OffloadConfig(cache_ratio="auto", max_gpu_memory="20GiB")


@pytest.mark.parametrize("value, expected", [("20GiB", 20 * 2**30), ("20GB", 20 * 10**9), ("500MiB", 500 * 2**20),
                                             (" 1.5GiB ", 3 * 2**29), (123456, 123456)])
def test_max_gpu_memory_takes_accelerates_spellings(value, expected):
    from oled_hf.offload.budget import parse_memory

    assert parse_memory(OffloadConfig(max_gpu_memory=value).max_gpu_memory) == expected


@pytest.mark.parametrize("value", [0, -5, True, 1.5, "20G", "abc", "", "-5GB"])
def test_max_gpu_memory_messages(value):
    with pytest.raises(ValueError) as err:
        OffloadConfig(max_gpu_memory=value)
    assert str(err.value) == (f"max_gpu_memory={value!r} is invalid: must be an int of bytes > 0 or a size string "
                              "such as '20GiB', '20GB' or '500MiB'")


def test_auto_knob_messages():
    assert OffloadConfig(cache_ratio="auto").auto and not OffloadConfig(cache_ratio=0.5).auto
    with pytest.raises(ValueError, match=r"cache_ratio='Auto' is invalid: .* or 'auto'"):
        OffloadConfig(cache_ratio="Auto")
    with pytest.raises(ValueError, match=r"gpu_memory_utilization=1.5 is invalid: must be a number in \(0, 1\]"):
        OffloadConfig(cache_ratio="auto", gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="auto_batch_size=0 is invalid: must be an integer >= 1"):
        OffloadConfig(cache_ratio="auto", auto_batch_size=0)
    with pytest.raises(ValueError, match="auto_context_length=0 is invalid: must be an integer >= 1, or None"):
        OffloadConfig(cache_ratio="auto", auto_context_length=0)


@pytest.mark.parametrize("value", [0, -3, 2.5, True, "10"])
def test_cache_size_messages(value):
    with pytest.raises(ValueError) as err:
        OffloadConfig(cache_size=value)
    assert f"cache_size={value!r} is invalid: must be an integer >= 1 (expert slots per MoE layer)" in str(err.value)


@pytest.mark.parametrize("value", [0, 0.0, 1.5, -0.1, math.nan, "0.5"])
def test_cache_ratio_messages(value):
    with pytest.raises(ValueError, match=r"cache_ratio=.* is invalid: must be a number in \(0, 1\]"):
        OffloadConfig(cache_ratio=value)


def test_choice_messages():
    with pytest.raises(ValueError) as err:
        OffloadConfig(cache_size=4, policy="foo")
    assert str(err.value) == ("policy='foo' is unknown; known policies: "
                              "lfu, lru, moe-infinity, oled, prefetch, static, tide")
    with pytest.raises(ValueError, match="cpu_compute='gpu' is unknown; allowed: auto, on, off"):
        OffloadConfig(cache_size=4, cpu_compute="gpu")
    with pytest.raises(ValueError, match="store='disk' is unknown; allowed: auto, mmap, pinned"):
        OffloadConfig(cache_size=4, store="disk")


@pytest.mark.parametrize(
    "field, value, pattern",
    [
        ("tide_interval", 0, "tide_interval=0 is invalid: must be an integer >= 1"),
        ("static_warmup_iterations", 1.5, "static_warmup_iterations=1.5 is invalid"),
        ("oled_confidence_threshold", 1.5, r"oled_confidence_threshold=1.5 is invalid: must be a number in \(0, 1\]"),
        ("oled_decay", -0.1, r"oled_decay=-0.1 is invalid: must be a number in \[0, 1\]"),
        ("h2d_bandwidth_gbps", -1, "h2d_bandwidth_gbps=-1 is invalid: must be a number > 0"),
        ("layer_adaptive", "yes", "layer_adaptive='yes' is invalid: must be True or False"),
        ("record_trace", "", "record_trace='' is invalid"),
    ],
)
def test_knob_messages(field, value, pattern):
    with pytest.raises(ValueError, match=pattern):
        OffloadConfig(cache_size=4, **{field: value})


def test_json_round_trip():
    cfg = legacy_config(cache_ratio=0.4, policy="tide", tide_interval=5, cpu_compute="off",
                        h2d_bandwidth_gbps=25.0, record_trace="/tmp/t.pt", layer_adaptive=False)
    with pytest.warns(FutureWarning, match="is deprecated"):  # the aliases round-trip too, warning again
        assert OffloadConfig.from_json(cfg.to_json()) == cfg
    with pytest.warns(FutureWarning, match="is deprecated"):
        assert OffloadConfig.from_dict(cfg.to_dict()) == cfg
    assert OffloadConfig.from_json(OffloadConfig(cache_size=100).to_json()).cache_size == 100
    for cfg in (OffloadConfig(cache_ratio="auto", auto_batch_size=4, auto_context_length=2048,
                              gpu_memory_utilization=0.8), OffloadConfig(max_gpu_memory="20GiB"),
                OffloadConfig(max_gpu_memory=5 * 2**30)):
        assert OffloadConfig.from_json(cfg.to_json()) == cfg


def test_system_names_a_live_system_and_round_trips():
    cfg = OffloadConfig(cache_size=8, system="lru+cpu+reuse+adaptive")
    assert OffloadConfig.from_json(cfg.to_json()) == cfg and cfg.to_dict()["system"] == "lru+cpu+reuse+adaptive"
    for text in ("lru-full", "mixtral-offloading", "score+cpu", " lfu+copy+uniform "):
        assert OffloadConfig(cache_size=8, system=text).system == text
    assert not legacy_config(cache_size=8, system="lru", layer_adaptive=False).layer_adaptive  # agrees: uniform


@pytest.mark.parametrize("kwargs, message", [
    (dict(system="lru+gpu"), r"^system='lru\+gpu' is invalid: unknown part 'gpu'; expected RETENTION\[\+PREFETCH\]"
                             r".*DISPATCH one of copy, cpu, cpu\+reuse.*or a preset: default, default-uniform, "
                             r"oled, lru, .*lru-full, lfu-full$"),
    (dict(system=""), r"^system='' is invalid: expected RETENTION"),
    (dict(system=4), r"^system=4 is invalid: expected RETENTION"),
    (dict(system="cpu+lru"), r"^system='cpu\+lru' is invalid: the first part must be a retention policy"),
    (dict(system="lru", policy="lfu"), r"^policy='lfu' and system='lru' are both given: the system names the "
                                       r"retention policy .*give no policy \(it is a deprecated alias\) or no system$"),
    (dict(system="promoe"), r"^system='promoe' is invalid for a live run: its prefetch part 'gate-capped' reads "
                            r"the next layer's predicted routes, which only a recorded trace holds \(oled-moe trace "
                            r"replay --system\); live prefetch parts: previous, matrix, e.g. "
                            r"'lru\+previous\+copy\+uniform'$"),
    (dict(system="lru+adaptive", layer_adaptive=False), r"^layer_adaptive=False and system='lru\+adaptive' disagree"),
])
def test_system_messages(kwargs, message):
    with pytest.raises(ValueError, match=message):
        OffloadConfig(cache_size=8, **kwargs)


@pytest.mark.parametrize("kwargs, spelt", [
    (dict(policy="lru"), "OffloadConfig(policy='lru') is deprecated and will be removed: "
                         "use system='lru+cpu+adaptive'"),
    (dict(policy="static", layer_adaptive=False), "OffloadConfig(policy='static', layer_adaptive=False) is "
                                                  "deprecated and will be removed: use system='static'"),
    (dict(layer_adaptive=False), "use system='default-uniform'"),
    (dict(policy="oled"), "use system='oled'"),  # the paper's method, no longer what None runs
    (dict(policy="prefetch"), "use system='lru+gate+cpu+adaptive' in replay (oled-moe trace replay --system; its "
                              "prefetch part 'gate' runs in replay only), system='lru+cpu+adaptive' for a live run"),
    (dict(system="lru", layer_adaptive=False), "the system 'lru' names the allocation; drop layer_adaptive"),
])
def test_legacy_aliases_warn_naming_the_system_spelling(kwargs, spelt):
    """``policy``/``layer_adaptive`` keep working, with a FutureWarning (Transformers-style) at the caller's line."""
    with pytest.warns(FutureWarning) as caught:
        cfg = OffloadConfig(cache_size=4, **kwargs)
    assert len(caught) == 1 and spelt in str(caught[0].message) and caught[0].filename == __file__
    if "system" not in kwargs:  # the (live) spelling it names runs the same system, less the replay-only prefetcher
        named = str(caught[0].message).split("system=")[-1].split("'")[1]
        live = dataclasses.replace(cfg.resolved_system(), prefetch="none")
        assert OffloadConfig(cache_size=4, system=named).resolved_system() == live


def test_one_path_warns_nothing():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for cfg in (OffloadConfig(cache_size=4), OffloadConfig(cache_size=4, system="lru"),
                    OffloadConfig(cache_size=4, system="lru+cpu+uniform", cpu_compute="off",
                                  oled_background_copies=3)):
            assert OffloadConfig.from_json(cfg.to_json()) == cfg
    assert OffloadConfig(cache_size=4).resolved_system() == parse_system("default")
    assert parse_system("default").parts == "learned+none+cpu+reuse+adaptive"


def test_from_dict_rejects_unknown_fields():
    with pytest.raises(ValueError, match="unknown OffloadConfig field.*cache_sise"):
        OffloadConfig.from_dict({"cache_sise": 4})


def test_resolve_slots():
    assert OffloadConfig(cache_size=100).resolve_slots(19, 256) == 1900
    assert OffloadConfig(cache_ratio=0.4).resolve_slots(19, 256) == round(0.4 * 19 * 256)
    assert OffloadConfig(cache_ratio=1.0).resolve_slots(19, 256) == 19 * 256
    assert OffloadConfig(cache_ratio=1 / 256).resolve_slots(19, 256) == 19  # one slot per layer, exactly
    with pytest.raises(ValueError) as err:
        OffloadConfig(cache_size=300).resolve_slots(19, 256)
    assert "cache_size=300" in str(err.value) and "num_experts=256" in str(err.value)


def test_resolve_slots_of_max_gpu_memory():
    one = 3 * 128 * 64 * 4  # tiny's expert in float32: 98304 bytes
    assert OffloadConfig(max_gpu_memory="5MiB").resolve_slots(3, 32, expert_bytes=one) == 5 * 2**20 // one == 53
    assert OffloadConfig(max_gpu_memory="1GiB").resolve_slots(3, 32, expert_bytes=one) == 96  # never more than all
    assert OffloadConfig(max_gpu_memory=3 * one).resolve_slots(3, 32, expert_bytes=one) == 3
    with pytest.raises(ValueError) as err:
        OffloadConfig(max_gpu_memory="200KiB").resolve_slots(3, 32, expert_bytes=one)
    assert str(err.value) == (
        "max_gpu_memory='200KiB' (98304 bytes per expert slot) gives 2 expert slots over 3 MoE layers, fewer than "
        "min_slots_per_layer=1 x 3 layers = 3 needed; the budget is not enlarged: use max_gpu_memory >= 294912 "
        "(bytes) (the budget does not give every layer even one slot)"
    )
    with pytest.raises(ValueError, match="cache_ratio='auto' is sized from the device when the model loads"):
        OffloadConfig(cache_ratio="auto").resolve_slots(3, 32)


# ---- the budget is never enlarged by min_slots_per_layer (issue 23 item 7) --------------------------


def test_min_slots_per_layer_refuses_instead_of_enlarging_the_budget():
    # 3 MoE layers x 64 experts: 10% is 19 slots; 30 per layer would need 90 (47% of the experts)
    with pytest.raises(ValueError) as err:
        OffloadConfig(cache_ratio=0.1, min_slots_per_layer=30).resolve_slots(3, 64)
    assert str(err.value) == (
        "cache_ratio=0.1 gives 19 expert slots over 3 MoE layers, fewer than min_slots_per_layer=30 x 3 layers "
        "= 90 needed; the budget is not enlarged: use cache_ratio >= 0.46875 or min_slots_per_layer <= 6"
    )
    assert OffloadConfig(cache_ratio=0.46875, min_slots_per_layer=30).resolve_slots(3, 64) == 90  # the fix works
    assert OffloadConfig(cache_ratio=0.1, min_slots_per_layer=6).resolve_slots(3, 64) == 19


def test_a_ratio_too_small_for_one_slot_per_layer_is_refused():
    with pytest.raises(ValueError) as err:
        OffloadConfig(cache_ratio=1e-9).resolve_slots(3, 64)
    assert str(err.value) == (
        "cache_ratio=1e-09 gives 0 expert slots over 3 MoE layers, fewer than min_slots_per_layer=1 x 3 layers = 3 "
        "needed; the budget is not enlarged: use cache_ratio >= 0.015625 (the budget does not give every layer "
        "even one slot)"
    )


def test_cache_size_below_min_slots_per_layer_is_refused():
    with pytest.raises(ValueError, match=r"cache_size=2 gives 6 expert slots over 3 MoE layers, fewer than "
                                         r"min_slots_per_layer=4 x 3 layers = 12 needed; .*use cache_size >= 4 "
                                         r"or min_slots_per_layer <= 2"):
        OffloadConfig(cache_size=2, min_slots_per_layer=4).resolve_slots(3, 64)


def test_load_refuses_an_infeasible_minimum_before_allocating(tiny_path):
    from oled_hf.modeling import OledLLaDA2ForDiffusionLM

    # tiny: 3 MoE layers x 32 experts; 0.1 -> 10 slots, 8 per layer would need 24
    with pytest.raises(ValueError, match="cache_ratio=0.1 gives 10 expert slots .* min_slots_per_layer=8"):
        OledLLaDA2ForDiffusionLM.from_pretrained(
            tiny_path, offload_config=OffloadConfig(cache_ratio=0.1, min_slots_per_layer=8))


@pytest.mark.parametrize("system", ["oled+previous", "moe-infinity+matrix+cpu"])
def test_live_prefetch_parts_are_accepted(system):
    assert OffloadConfig(cache_size=8, system=system).resolved_system().prefetch in ("previous", "matrix")


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_gpu_memory="infGiB"), "max_gpu_memory='infGiB' is invalid: must be an int of bytes > 0"),
    (dict(max_gpu_memory="1e400GiB"), "max_gpu_memory='1e400GiB' is invalid: must be an int of bytes > 0"),
    (dict(max_gpu_memory="1e30GiB"), "max_gpu_memory='1e30GiB' is invalid: 1.07e+39 bytes is more than any device "
                                     "holds (at most 9223372036854775807 bytes"),
    (dict(max_gpu_memory=2**64), "max_gpu_memory=18446744073709551616 is invalid: 1.84e+19 bytes is more than"),
    (dict(cache_size=2, device="emulated", emulated_memory="1e400GiB"), "emulated_memory='1e400GiB' is invalid"),
    (dict(cache_size=2, device="emulated", emulated_memory="nanGiB"), "emulated_memory='nanGiB' is invalid"),
])
def test_infinite_and_absurd_sizes_are_one_valueerror(kwargs, message):
    """Issue 67 item 13: OverflowError (int of an infinite float inside accelerate) instead of the field's message."""
    with pytest.raises(ValueError) as info:
        OffloadConfig(**kwargs)
    assert str(info.value).startswith(message)


@pytest.mark.parametrize("kwargs", [dict(emulated_latency_us=50), dict(emulated_latency_us=5.0),
                                    dict(emulated_memory="1GiB"), dict(emulated_bandwidth_gbps=2.0)])
def test_emulated_fields_without_the_emulated_device_are_refused(kwargs):
    """Issue 67 item 14: ``emulated_latency_us=50`` without ``device='emulated'`` was accepted and silently ignored."""
    (name, value), = kwargs.items()
    with pytest.raises(ValueError) as info:
        OffloadConfig(cache_size=4, **kwargs)
    assert str(info.value) == (f"{name}={value!r}: the emulated link's fields (emulated_bandwidth_gbps, "
                               "emulated_latency_us, emulated_memory) apply to device='emulated' only, and "
                               "device='auto'; add device='emulated' or drop them")
    assert OffloadConfig(cache_size=4, device="emulated", **kwargs).to_dict()[name] == value


def test_the_emulated_latency_defaults_to_five_microseconds():
    from oled_hf.offload.config import DEFAULT_EMULATED_LATENCY_US

    config = OffloadConfig(cache_size=4, device="emulated")
    assert config.emulated_latency_us is None and DEFAULT_EMULATED_LATENCY_US == 5.0
    assert OffloadConfig.from_json(config.to_json()) == config


def test_admission_by_priority_is_a_config_field_of_a_cpu_dispatch():
    """``admission="priority"`` reaches the dispatch part live (the dispatch knob); a copy dispatch copies every
    miss anyway, so it is not added there; a bad value is one line naming the allowed ones."""
    cfg = OffloadConfig(cache_size=4, system="lru-full", admission="priority")
    assert cfg.resolved_system().knobs["dispatch.admission"] == "priority"
    assert "dispatch.admission" not in cfg.resolved_system(cpu_compute="off").knobs
    assert "dispatch.admission" not in OffloadConfig(cache_size=4).resolved_system().knobs
    assert OffloadConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ValueError, match=r"^admission='maybe' is unknown; allowed: all, priority$"):
        OffloadConfig(cache_size=4, admission="maybe")
