import json
from pathlib import Path

import pytest
from oled_hf.modeling import OledLLaDA2Config

REAL = Path(__file__).resolve().parents[1] / "data" / "llada2.0-mini-config.json"  # verbatim copy
TINY = dict(vocab_size=512, hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            head_dim=32, rotary_dim=16, num_experts=32, num_experts_per_tok=4, n_group=4, topk_group=2)


def test_real_config_loads_with_every_value_kept():
    raw = json.loads(REAL.read_text())
    config = OledLLaDA2Config.from_json_file(REAL)
    for key, value in raw.items():
        if key in ("auto_map", "architectures", "model_type", "transformers_version", "dtype"):
            continue
        assert getattr(config, key) == value, key
    assert str(config.dtype) == "torch.bfloat16"
    assert config.mask_token_id == 156895 and config.eos_token_id == 156892 and config.pad_token_id == 156892
    assert config.num_moe_layers == 19


def test_defaults_are_llada2_mini():
    config = OledLLaDA2Config()
    assert (config.num_experts, config.n_group, config.topk_group, config.num_experts_per_tok) == (256, 8, 4, 8)
    assert config.rotary_dim == 64 and config.head_dim == 128


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(num_experts=30, n_group=4), "n_group=4 must divide num_experts=30"),
        (dict(num_experts=4, n_group=4, topk_group=2, num_experts_per_tok=1), "at least 2 are required"),
        (dict(topk_group=1, num_experts_per_tok=9), "num_experts_per_tok=9"),
        (dict(rotary_dim=15), "rotary_dim=15"),
        (dict(rotary_dim=64), "rotary_dim=64"),
        (dict(num_attention_heads=5), "num_key_value_heads=2"),
        (dict(first_k_dense_replace=5), "first_k_dense_replace=5"),
        (dict(score_function="relu"), "score_function='relu'"),
    ],
)
def test_bad_config_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=field.replace("(", r"\(").replace("+", r"\+")):
        OledLLaDA2Config(**{**TINY, **overrides})


def test_rope_scaling_other_than_null_is_rejected():
    with pytest.raises(ValueError, match="rope_scaling"):
        OledLLaDA2Config(**TINY, rope_scaling={"type": "linear", "factor": 2.0})
