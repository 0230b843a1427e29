import json
from pathlib import Path

import torch
from oled_hf.modeling import OledLLaDA2ForDiffusionLM
from safetensors import safe_open

from oled_hf.checkpoints.factory import make_checkpoint
from oled_hf.checkpoints.prepare import prepare_checkpoint

REAL = Path(__file__).resolve().parents[1] / "data" / "llada2.0-mini-config.json"


def _ids(n=12):
    return torch.randint(0, 500, (1, n), generator=torch.Generator().manual_seed(0))


def test_checkpoint_layout(tiny_path):
    index = json.loads((tiny_path / "model.safetensors.index.json").read_text())
    names = set(index["weight_map"])
    assert "model.layers.1.mlp.experts.31.down_proj.weight" in names
    assert "model.layers.1.mlp.gate.expert_bias" in names
    assert "model.layers.0.mlp.gate_proj.weight" in names
    assert "model.layers.2.attention.query_key_value.weight" in names
    assert "lm_head.weight" in names and "model.word_embeddings.weight" in names
    assert len(set(index["weight_map"].values())) > 1
    config = json.loads((tiny_path / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_oled_llada2.OledLLaDA2ForDiffusionLM"
    gen = json.loads((tiny_path / "generation_config.json").read_text())
    assert gen["mask_token_id"] == 511 and gen["block_length"] == 32
    for f in ("tokenizer.json", "tokenizer_config.json", "configuration_oled_llada2.py"):
        assert (tiny_path / f).is_file()


def test_make_checkpoint_is_deterministic(tmp_path, tiny_path):
    other = make_checkpoint(tmp_path / "again", preset="tiny", seed=0)
    for shard in sorted(tiny_path.glob("*.safetensors")):
        assert (other / shard.name).read_bytes() == shard.read_bytes()
    third = make_checkpoint(tmp_path / "seed1", preset="tiny", seed=1)
    name = "model.layers.1.mlp.gate.expert_bias"
    shard = json.loads((third / "model.safetensors.index.json").read_text())["weight_map"][name]
    with safe_open(third / shard, "pt") as a, safe_open(tiny_path / shard, "pt") as b:
        assert not torch.equal(a.get_tensor(name), b.get_tensor(name))


def test_save_then_load_round_trip(tiny_model, tmp_path):
    tiny_model.save_pretrained(tmp_path / "saved")
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert set(config["auto_map"]) == {"AutoConfig", "AutoModel", "AutoModelForCausalLM"}
    for target in config["auto_map"].values():
        assert (tmp_path / "saved" / f"{target.split('.')[0]}.py").is_file()
    again = OledLLaDA2ForDiffusionLM.from_pretrained(tmp_path / "saved").eval()
    with torch.no_grad():
        torch.testing.assert_close(again(_ids()).logits, tiny_model(_ids()).logits, rtol=0, atol=0)


def _stored_tensor(path, name):
    shard = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"][name]
    with safe_open(path / shard, "pt") as f:
        return f.get_tensor(name)


def test_bf16_expert_bias_follows_official_loader_or_stays_fp32(tiny_path):
    """Official Transformers loading casts every floating tensor to ``dtype``, the expert bias too; the
    router then adds that bf16 bias to fp32 scores. ``router_bias_fp32=True`` keeps dInfer's fp32 bias."""
    from oled_hf.modeling.modeling_oled_llada2 import route_tokens

    name = "model.layers.1.mlp.gate.expert_bias"
    stored = _stored_tensor(tiny_path, name)
    assert stored.dtype == torch.float32
    official = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, dtype=torch.bfloat16)
    kept = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, dtype=torch.bfloat16, router_bias_fp32=True)
    gate_official, gate_kept = official.moe_blocks()[0].gate, kept.moe_blocks()[0].gate
    assert gate_official.expert_bias.dtype == torch.bfloat16
    assert torch.equal(gate_official.expert_bias, stored.to(torch.bfloat16))
    assert gate_kept.expert_bias.dtype == torch.float32 and torch.equal(gate_kept.expert_bias, stored)
    assert gate_kept.weight.dtype == torch.bfloat16 and kept.lm_head.weight.dtype == torch.bfloat16
    x = torch.randn(4096, official.config.hidden_size, generator=torch.Generator().manual_seed(0)).bfloat16()
    weight = gate_official.weight
    _, ids_official, _ = gate_official(x)
    _, ids_kept, _ = gate_kept(x)
    # The fixture: the router rules with the bias rounded to bf16, respectively kept in fp32.
    assert torch.equal(ids_official, route_tokens(x, weight, stored.to(torch.bfloat16).float(), official.config)[1])
    assert torch.equal(ids_kept, route_tokens(x, weight, stored, kept.config)[1])
    assert not torch.equal(ids_official, ids_kept)  # the rounding flips near-tied selections
    with torch.no_grad():
        assert torch.isfinite(official(_ids()).logits).all()


def _official_folder(tiny_path, folder):
    """An unmodified-official-style folder: llada2_moe config with its own auto_map, same tensors."""
    folder.mkdir()
    official = json.loads(REAL.read_text())
    ours = json.loads((tiny_path / "config.json").read_text())
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "rotary_dim", "intermediate_size", "num_experts", "num_experts_per_tok",
                "moe_intermediate_size", "n_group", "topk_group", "max_position_embeddings", "pad_token_id",
                "mask_token_id"):  # the official file has no mask id: LLaDA2's default is past a tiny vocab
        official[key] = ours[key]
    official["dtype"] = "float32"
    (folder / "config.json").write_text(json.dumps(official))
    for f in tiny_path.iterdir():
        if f.suffix in (".safetensors",) or f.name.startswith("tokenizer") or f.name.endswith(".index.json"):
            (folder / f.name).write_bytes(f.read_bytes())
    return folder


def test_official_folder_loads_and_prepare_links(tiny_path, tiny_model, tmp_path):
    src = _official_folder(tiny_path, tmp_path / "official")
    direct = OledLLaDA2ForDiffusionLM.from_pretrained(src).eval()
    with torch.no_grad():
        torch.testing.assert_close(direct(_ids()).logits, tiny_model(_ids()).logits, rtol=0, atol=0)
    out = prepare_checkpoint(src, tmp_path / "prepared")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "oled_llada2"
    assert config["architectures"] == ["OledLLaDA2ForDiffusionLM"]
    assert config["routed_scaling_factor"] == 2.5 and config["max_window_layers"] == 28
    for shard in src.glob("*.safetensors"):
        assert (out / shard.name).is_symlink() and (out / shard.name).resolve() == shard.resolve()
    assert (out / "tokenizer.json").is_symlink()
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    assert type(model).__name__ == "OledLLaDA2ForDiffusionLM"
    with torch.no_grad():
        torch.testing.assert_close(model(_ids()).logits, tiny_model(_ids()).logits, rtol=0, atol=0)


def test_prepare_rejects_non_llada2(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    import pytest

    with pytest.raises(ValueError, match="model_type='llama'"):
        prepare_checkpoint(tmp_path / "src", tmp_path / "out")


def test_llada21_family_checkpoints_decode_with_editing(tiny_path, tmp_path):
    from oled_hf.modeling.params import resolve_params

    from oled_hf.cli.main import main

    assert main(["make-tiny", str(tmp_path / "t21"), "--family", "llada2.1"]) == 0
    gen = json.loads((tmp_path / "t21" / "generation_config.json").read_text())
    assert (gen["decoding"], gen["threshold"], gen["editing_threshold"], gen["max_post_steps"]) == (
        "quality", 0.7, 0.5, 16)
    assert "decoding" not in json.loads((tiny_path / "generation_config.json").read_text())
    model = OledLLaDA2ForDiffusionLM.from_pretrained(tmp_path / "t21")
    params = resolve_params(model.config, model.generation_config, 3, {})
    assert (params.threshold, params.editing_threshold, params.max_post_steps) == (0.7, 0.5, 16)
    # prepare: recognised by the folder name, or told
    src21 = _official_folder(tiny_path, tmp_path / "LLaDA2.1-mini")
    gen21 = json.loads((prepare_checkpoint(src21, tmp_path / "p21") / "generation_config.json").read_text())
    assert (gen21["decoding"], gen21["editing_threshold"]) == ("quality", 0.5)
    src20 = _official_folder(tiny_path, tmp_path / "LLaDA2.0-mini")
    gen20 = json.loads((prepare_checkpoint(src20, tmp_path / "p20") / "generation_config.json").read_text())
    assert "decoding" not in gen20 and "editing_threshold" not in gen20
    told = prepare_checkpoint(src20, tmp_path / "p20b", family="llada2.1")
    assert json.loads((told / "generation_config.json").read_text())["decoding"] == "quality"
    import pytest

    with pytest.raises(ValueError, match="family='llada3'"):
        prepare_checkpoint(src20, tmp_path / "bad", family="llada3")
