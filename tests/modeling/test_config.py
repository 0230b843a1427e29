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


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(num_experts_per_tok=0), "num_experts_per_tok=0 is invalid: must be a positive integer"),
        (dict(n_group=0), "n_group=0 is invalid: must be a positive integer"),
        (dict(num_experts="many"), "num_experts='many' is invalid: must be a positive integer"),
        (dict(num_experts=True), "num_experts=True is invalid: must be a positive integer"),
        (dict(hidden_size=128.0), "hidden_size=128.0 is invalid: must be a positive integer"),
        (dict(max_position_embeddings=0), "max_position_embeddings=0 is invalid: must be a positive integer"),
        (dict(max_position_embeddings=-8), "max_position_embeddings=-8 is invalid"),
        (dict(rms_norm_eps=-1), "rms_norm_eps=-1 is invalid: must be a finite number > 0"),
        (dict(rms_norm_eps=float("nan")), "rms_norm_eps=nan is invalid"),
        (dict(rope_theta=0), "rope_theta=0 is invalid: must be a finite number > 0"),
        (dict(rope_theta="600000"), "rope_theta='600000' is invalid"),
        (dict(num_attention_heads=0, head_dim=None), "num_attention_heads=0 is invalid"),
        (dict(head_dim=0), "head_dim=0 is invalid: must be a positive integer or null"),
        (dict(num_shared_experts=-1), "num_shared_experts=-1 is invalid: must be an integer >= 0"),
        (dict(partial_rotary_factor=0, rotary_dim=None), r"partial_rotary_factor=0 is invalid: must be a number in"),
        (dict(attention_dropout=2.0), "attention_dropout=2.0 is invalid: must be a number between 0 and 1"),
        (dict(norm_topk_prob="yes"), "norm_topk_prob='yes' is invalid: must be true or false"),
        (dict(hidden_act="gelu"), "hidden_act='gelu' is invalid: allowed: silu"),
        (dict(mask_token_id=-1), r"mask_token_id=-1 is invalid: must be a token id"),
        (dict(eos_token_id=[1, "x"]), r"eos_token_id=\[1, 'x'\] is invalid"),
        (dict(num_experts_per_tok=33), "num_experts_per_tok=33 exceeds num_experts=32"),
        (dict(topk_group=5), "topk_group=5 must be between 1 and n_group=4"),
        (dict(num_experts=34), "n_group=4 must divide num_experts=34"),
    ],
)
def test_impossible_values_name_the_field_value_and_what_is_allowed(overrides, message):
    with pytest.raises(ValueError, match=message):
        OledLLaDA2Config(**{**TINY, **overrides})


def test_impossible_value_in_config_json_is_refused_at_load(tmp_path):
    raw = json.loads(REAL.read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**raw, "n_group": 0}))
    with pytest.raises(ValueError, match="n_group=0 is invalid: must be a positive integer"):
        OledLLaDA2Config.from_json_file(path)


def test_shipped_and_real_configs_still_load():
    from oled_hf.toy import TOY_CHECKPOINT

    toy = Path(TOY_CHECKPOINT)
    shipped = [toy / "config.json", toy.parent / "long" / "checkpoint" / "config.json"]
    for path in [REAL, *shipped]:
        assert OledLLaDA2Config.from_json_file(path).num_experts > 0, path
