"""Loading refuses checkpoints that would give wrong weights: missing, unexpected, duplicated, integer tensors.

Each case is a copy of the tiny checkpoint with one fault; resident and offloaded loads must both
raise a ``CheckpointError`` (a ValueError) naming the tensor, and ``strict=False`` is the opt-out.
"""

import json

import pytest
import torch
from oled_hf.modeling import OledLLaDA2ForDiffusionLM
from oled_hf.modeling.checkpoint_files import CheckpointError

from oled_hf import OffloadConfig

EXPERT = "model.layers.1.mlp.experts.3.gate_proj.weight"


def _load(path, offloaded: bool, **kwargs):
    extra = dict(offload_config=OffloadConfig(cache_size=4)) if offloaded else {}
    return OledLLaDA2ForDiffusionLM.from_pretrained(path, **extra, **kwargs)


def _index(path) -> dict:
    return json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]


@pytest.mark.parametrize("offloaded", [False, True], ids=["resident", "offloaded"])
def test_missing_lm_head_is_an_error_and_strict_false_opts_out(copy_checkpoint, offloaded):
    path = copy_checkpoint({"lm_head.weight": None})
    with pytest.raises(CheckpointError, match=r"ckpt: the checkpoint does not match OledLLaDA2ForDiffusionLM "
                                              r"\(config.json\): missing 1 tensor\(s\) the model needs: "
                                              r"lm_head.weight\. .*pass strict=False"):
        _load(path, offloaded)
    assert _load(path, offloaded, strict=False).lm_head.weight.shape == (512, 128)


@pytest.mark.parametrize("offloaded", [False, True], ids=["resident", "offloaded"])
def test_more_layers_in_config_than_in_checkpoint(copy_checkpoint, offloaded):
    path = copy_checkpoint()
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 5}))
    with pytest.raises(CheckpointError, match=r"missing \d+ tensor\(s\) the model needs: "
                                              r"model\.layers\.4\.attention\.dense\.weight"):
        _load(path, offloaded)


def test_missing_expert_resident_and_offloaded(copy_checkpoint, tiny_model):
    path = copy_checkpoint({EXPERT: None})
    with pytest.raises(CheckpointError, match=rf"missing 1 tensor\(s\) the model needs: {EXPERT}\."):
        _load(path, False)
    with pytest.raises(CheckpointError, match=rf"ckpt: the checkpoint lacks 1 routed-expert tensor\(s\) the "
                                              rf"offloaded model needs: {EXPERT} \(strict=False cannot"):
        _load(path, True, strict=False)


def test_unexpected_tensors_are_an_error(copy_checkpoint, tiny_model):
    w = tiny_model.state_dict()[EXPERT]
    path = copy_checkpoint()
    shard = _index(path)["lm_head.weight"]
    from safetensors.torch import load_file, save_file

    tensors = load_file(path / shard)
    tensors["model.layers.1.mlp.experts.40.gate_proj.weight"] = w  # an expert id the config lacks
    tensors["model.layers.0.foo.weight"] = torch.zeros(3)
    save_file(tensors, path / shard, metadata={"format": "pt"})
    for offloaded in (False, True):
        with pytest.raises(CheckpointError, match=r"2 unexpected tensor\(s\) the model has no place for: "
                                                  r"model\.layers\.0\.foo\.weight, "
                                                  r"model\.layers\.1\.mlp\.experts\.40\.gate_proj\.weight"):
            _load(path, offloaded)


@pytest.mark.parametrize("offloaded", [False, True], ids=["resident", "offloaded"])
def test_int8_expert_is_refused_not_cast(copy_checkpoint, tiny_model, offloaded):
    path = copy_checkpoint({EXPERT: tiny_model.state_dict()[EXPERT].mul(100).to(torch.int8)})
    shard = _index(path)[EXPERT]
    with pytest.raises(CheckpointError, match=rf"{shard}: tensor {EXPERT} is stored as I8 but the model's weight "
                                              r"is floating point; integer \(e\.g\. quantised\) tensors are not cast"):
        _load(path, offloaded, strict=False)


def test_tensor_in_two_shards_is_refused(copy_checkpoint, tiny_model):
    path = copy_checkpoint()
    index = _index(path)
    home = index["lm_head.weight"]
    other = sorted(set(index.values()) - {home})[0]
    from safetensors.torch import load_file, save_file

    tensors = load_file(path / other)
    tensors["lm_head.weight"] = torch.zeros_like(tiny_model.lm_head.weight)
    save_file(tensors, path / other, metadata={"format": "pt"})
    for offloaded in (False, True):
        with pytest.raises(CheckpointError, match=rf"tensor lm_head\.weight is also stored in .*; "
                                                  rf"model\.safetensors\.index\.json names {home}; a tensor must be in "
                                                  r"exactly one shard"):
            _load(path, offloaded, strict=False)


def test_strict_must_be_a_bool(tiny_path):
    with pytest.raises(ValueError, match=r"strict='no' is invalid"):
        OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, strict="no")
