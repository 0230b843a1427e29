"""OffloadConfig: validation messages, JSON round trip, slot resolution against the model."""

import math

import pytest

from oled_hf.offload.config import OffloadConfig


def test_needs_exactly_one_budget():
    with pytest.raises(ValueError, match="exactly one of cache_size .* or cache_ratio .*got neither"):
        OffloadConfig()
    with pytest.raises(ValueError, match="got both"):
        OffloadConfig(cache_size=4, cache_ratio=0.5)


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
    cfg = OffloadConfig(cache_ratio=0.4, policy="tide", tide_interval=5, cpu_compute="off",
                        h2d_bandwidth_gbps=25.0, record_trace="/tmp/t.pt", layer_adaptive=False)
    assert OffloadConfig.from_json(cfg.to_json()) == cfg
    assert OffloadConfig.from_dict(cfg.to_dict()) == cfg
    assert OffloadConfig.from_json(OffloadConfig(cache_size=100).to_json()).cache_size == 100


def test_from_dict_rejects_unknown_fields():
    with pytest.raises(ValueError, match="unknown OffloadConfig field.*cache_sise"):
        OffloadConfig.from_dict({"cache_sise": 4})


def test_resolve_slots():
    assert OffloadConfig(cache_size=100).resolve_slots(19, 256) == 1900
    assert OffloadConfig(cache_ratio=0.4).resolve_slots(19, 256) == round(0.4 * 19 * 256)
    assert OffloadConfig(cache_ratio=1.0).resolve_slots(19, 256) == 19 * 256
    assert OffloadConfig(cache_ratio=1e-6).resolve_slots(19, 256) == 19  # at least one slot per layer
    with pytest.raises(ValueError) as err:
        OffloadConfig(cache_size=300).resolve_slots(19, 256)
    assert "cache_size=300" in str(err.value) and "num_experts=256" in str(err.value)
