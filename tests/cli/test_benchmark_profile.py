"""``benchmark --profile``: a forward's time split into sections, and ``--skip-resident``."""

import json

import pytest

from oled_hf.cli.benchmark_profile import SectionTimes, section_of, split
from oled_hf.cli.main import main


def test_split_accounts_for_the_whole_forward():
    timer = SectionTimes()
    timer.seconds.update(attention=0.2, routing=0.1, shared_expert=0.05, moe_block=0.9)
    out = split(timer, {"policy": 0.1, "copy": 0.2, "gpu": 0.3, "cpu": 0.4, "cpu_wait": 0.0}, total_s=1.5, forwards=10)
    assert out["total"] == pytest.approx(150.0) and out["planner"] == pytest.approx(10.0)
    assert "moe_block" not in out and "experts_resident" not in out  # offloaded: the executor's timers say it
    serial = sum(v for k, v in out.items() if k not in ("total", "other", "experts_host"))
    assert serial + out["other"] == pytest.approx(out["total"])  # the host worker's time overlaps: not summed
    resident = split(timer, {}, total_s=1.5, forwards=10)
    assert resident["experts_resident"] == pytest.approx(75.0)  # MoE block less router and shared expert


def test_sections_are_named_by_module_kind(tiny_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    named = {}
    for name, module in model.named_modules():
        section = section_of(name, module)
        if section is not None:
            named.setdefault(section, []).append(name)
    layers = model.config.num_hidden_layers
    assert len(named["attention"]) == layers and named["lm_head"] == ["lm_head"]
    moe = sum(model.config.is_moe_layer(i) for i in range(layers))
    assert len(named["routing"]) == len(named["moe_block"]) == moe
    assert len(named["dense_mlp"]) == layers - moe


def test_benchmark_profile_without_resident(tiny_path, capsys):
    code = main(["benchmark", "--model", str(tiny_path), "--max-new-tokens", "8", "--block-length", "8",
                 "--cache-size", "8", "--system", "oled", "--runs", "1", "--warmup-runs", "0",
                 "--prompt", "hello", "--json", "--profile", "--skip-resident"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["config"] for r in rows] == ["oled @ cache size 8"]
    row = rows[0]
    assert row["same_tokens"] is None and row["ratio_to_full"] is None
    profile = row["profile"]
    for key in ("attention", "routing", "planner", "copies", "experts_cached", "other", "total"):
        assert profile[key] >= 0
    assert profile["attention"] > 0 and profile["experts_cached"] > 0
    assert sum(v for k, v in profile.items() if k not in ("total", "experts_host")) == pytest.approx(profile["total"])


def test_benchmark_steps_must_be_positive(tiny_path, capsys):
    assert main(["benchmark", "--model", str(tiny_path), "--cache-size", "8", "--steps", "0"]) == 2
    assert "--steps 0 is invalid: must be at least 1" in capsys.readouterr().err
