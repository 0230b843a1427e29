"""The real-size checkpoint maker, on reduced sizes: mini's dimensions, streaming shards, determinism, refusals.

The full 32 GB folder is written by the real-size benchmark (``eval/real_size.py``), not here.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from oled_hf.checkpoints import streaming
from oled_hf.checkpoints.factory import make_checkpoint, make_config
from oled_hf.cli.main import main

OFFICIAL = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "llada2.0-mini" / "config.json"
DIMENSIONS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "intermediate_size", "moe_intermediate_size", "num_experts", "num_experts_per_tok",
              "n_group", "topk_group", "num_shared_experts", "first_k_dense_replace", "routed_scaling_factor",
              "rotary_dim", "partial_rotary_factor", "rope_theta", "max_position_embeddings", "pad_token_id")
# mini's structure at a width a test writes in seconds (vocab and special ids kept: the official tokenizer)
NARROW = dict(num_hidden_layers=3, hidden_size=64, intermediate_size=96, moe_intermediate_size=16, num_experts=16,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, rotary_dim=8)


def test_the_mini_preset_has_the_official_dimensions():
    config = make_config("mini").to_dict()
    if OFFICIAL.is_file():
        official = json.loads(OFFICIAL.read_text())
        for name in DIMENSIONS:
            assert config[name] == official[name], name
    assert (config["num_experts"], config["num_experts_per_tok"], config["num_hidden_layers"]) == (256, 8, 20)
    specs = streaming.plan_tensors(make_config("mini"), torch.bfloat16)
    total = sum(s.nbytes for s in specs)
    assert 31e9 < total < 33e9  # ~16B parameters in bf16
    assert len(streaming.plan_shards(specs, 5 * 10**9)) == 7
    cut = make_config("mini", num_hidden_layers=4).to_dict()
    assert cut["num_hidden_layers"] == 4 and all(cut[n] == config[n] for n in DIMENSIONS if n != "num_hidden_layers")


def test_streamed_folder_is_sharded_deterministic_and_loads(tmp_path):
    a = streaming.write_random_checkpoint(tmp_path / "a", make_config("mini", **NARROW), seed=3,
                                          shard_bytes=10 << 20)
    b = streaming.write_random_checkpoint(tmp_path / "b", make_config("mini", **NARROW), seed=3,
                                          shard_bytes=10 << 20)
    c = streaming.write_random_checkpoint(tmp_path / "c", make_config("mini", **NARROW), seed=4,
                                          shard_bytes=10 << 20)
    index = json.loads((a.path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert a.shards == len(shards) > 1 and shards[0] == f"model-00001-of-{a.shards:05d}.safetensors"
    assert index["metadata"]["total_size"] == sum(s.nbytes for s in streaming.plan_tensors(
        make_config("mini", **NARROW), torch.bfloat16))
    for name in shards:
        assert (a.path / name).read_bytes() == (b.path / name).read_bytes()
    assert (a.path / shards[-1]).read_bytes() != (c.path / shards[-1]).read_bytes()
    key = "model.layers.1.mlp.experts.15.down_proj.weight"
    with safe_open(a.path / index["weight_map"][key], "pt") as f:
        w = f.get_tensor(key)
    assert w.dtype == torch.bfloat16 and tuple(w.shape) == (64, 16)
    assert 0.01 < w.float().std().item() < 0.03  # the config's initializer_range (0.02)
    from oled_hf.modeling import OledLLaDA2ForDiffusionLM

    model = OledLLaDA2ForDiffusionLM.from_pretrained(a.path)
    assert torch.equal(model.state_dict()[key], w)


def test_too_little_disk_is_refused_before_the_first_byte(tmp_path, monkeypatch):
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(streaming.shutil, "disk_usage", lambda p: usage._replace(free=1 << 30))
    out = tmp_path / "mini"
    with pytest.raises(ValueError, match=r"this checkpoint needs 30\.\d GiB of disk \(\+256 MiB margin\) but the disk "
                                         r"holding .* has 1\.0 GiB free; nothing was written"):
        make_checkpoint(out, preset="mini")
    assert not out.exists() and os.listdir(tmp_path) == []


def test_cli_layers_must_be_positive(tmp_path, capsys):
    assert main(["make-tiny", str(tmp_path / "x"), "--preset", "mini", "--layers", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--layers 0 is invalid: must be an integer >= 1" in err[0]
    assert not (tmp_path / "x").exists()
