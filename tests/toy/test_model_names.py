"""Issue 35.8: each shipped toy is served under its own name, and re-made toys keep theirs."""

import json
from pathlib import Path

import pytest

from oled_hf.toy.long.tasks import TaskSpec
from oled_hf.toy.long.train import MODEL_NAMES, train_long

REPO = Path(__file__).resolve().parents[2]
NAMES = {"oled_hf/toy/checkpoint": "oled-toy-addition", "oled_hf/toy/long/checkpoint": "oled-toy-long",
         "oled_hf/toy/deep/checkpoint": "oled-toy-deep"}
MICRO = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
             rotary_dim=8, intermediate_size=64, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=8,
             n_group=4, topk_group=2)
FAST = dict(batch_size=4, eval_n=0, log_every=0, eval_every=0, warmup=1, model_overrides=MICRO, save=False)


@pytest.mark.parametrize("folder, name", NAMES.items())
def test_shipped_toys_carry_their_own_name(folder, name):
    assert json.loads((REPO / folder / "config.json").read_text())["oled_model_name"] == name


def test_addition_toy_config_names_itself(tmp_path):
    from oled_hf.toy.tokenizer import build_toy_tokenizer
    from oled_hf.toy.train import toy_config

    assert toy_config(build_toy_tokenizer(tmp_path)).oled_model_name == "oled-toy-addition"


@pytest.mark.parametrize("preset", ["long", "deep"])
def test_long_training_writes_the_preset_name(tmp_path, preset):
    model = train_long(tmp_path / preset, (TaskSpec("count", 1.0, 10, 10),), steps=1, preset=preset, **FAST)[
        "trained_model"]
    assert model.config.oled_model_name == MODEL_NAMES[preset] == NAMES[f"oled_hf/toy/{preset}/checkpoint"]
