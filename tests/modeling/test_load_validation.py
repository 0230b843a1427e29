"""Corrupt or mismatched parts are refused at load, naming what is wrong (issue 23, items 6 and 9).

Each case is a copy of the tiny checkpoint with one fault: NaN/inf weights (a NaN ``expert_bias``
used to give silently different tokens), a shard index that points outside the folder or is
empty, bytes appended to a shard, a tensor whose shape disagrees with config.json. Resident and
offloaded loads must both raise a ``CheckpointError`` (a ValueError) naming the file and tensor.
"""

import json
import os
import re

import pytest
import torch
from oled_hf.modeling import OledLLaDA2ForDiffusionLM
from oled_hf.modeling.checkpoint_files import CheckpointError, first_non_finite, read_safetensors_header
from safetensors.torch import load_file, save_file

from oled_hf import OffloadConfig
from oled_hf.offload.store import ExpertStore

BIAS = "model.layers.1.mlp.gate.expert_bias"
EMBED = "model.word_embeddings.weight"
EXPERT = "model.layers.2.mlp.experts.5.up_proj.weight"
INDEX = "model.safetensors.index.json"


def _load(path, offloaded: bool, **kwargs):
    extra = dict(offload_config=OffloadConfig(cache_size=4)) if offloaded else {}
    return OledLLaDA2ForDiffusionLM.from_pretrained(path, **extra, **kwargs)


def _weight_map(path) -> dict:
    return json.loads((path / INDEX).read_text())["weight_map"]


def _poisoned(tiny_model, name: str, value: float, at=(3,)) -> dict:
    """``name``'s tensor from the clean model with one element replaced by ``value``."""
    tensor = tiny_model.state_dict()[name].clone()
    tensor[at] = value
    return {name: tensor}


@pytest.mark.parametrize("offloaded", [False, True], ids=["resident", "offloaded"])
@pytest.mark.parametrize("name, value, at", [(BIAS, float("nan"), (3,)), (EMBED, float("inf"), (3, 7)),
                                             (EMBED, float("-inf"), (3, 7))],
                         ids=["nan-expert-bias", "inf-embedding", "minus-inf-embedding"])
def test_non_finite_weight_is_refused_at_load_naming_tensor_and_file(copy_checkpoint, tiny_model, offloaded,
                                                                     name, value, at):
    path = copy_checkpoint(_poisoned(tiny_model, name, value, at))
    shard = path / _weight_map(path)[name]
    message = (rf"^{re.escape(str(shard))}: tensor {re.escape(name)} holds 1 non-finite value\(s\) \(NaN or inf\) "
               rf"of \d+, the first at index {re.escape(str(list(at)))}")
    with pytest.raises(CheckpointError, match=message):
        _load(path, offloaded)


def test_a_value_overflowing_float16_says_so(copy_checkpoint, tiny_model):
    path = copy_checkpoint(_poisoned(tiny_model, EMBED, 1e6, at=(2, 2)))
    with pytest.raises(CheckpointError, match=rf"tensor {re.escape(EMBED)} holds 1 non-finite .* the first at index "
                                              r"\[2, 2\]; the checkpoint is corrupt, or its values overflow float16"):
        _load(path, False, dtype=torch.float16)


def test_nan_in_a_routed_expert_is_refused_resident_and_offloaded(copy_checkpoint, tiny_model):
    path = copy_checkpoint(_poisoned(tiny_model, EXPERT, float("nan"), at=(1, 2)))
    shard = re.escape(str(path / _weight_map(path)[EXPERT]))
    message = rf"^{shard}: tensor {re.escape(EXPERT)} holds 1 non-finite value\(s\) .* the first at index \[1, 2\]"
    with pytest.raises(CheckpointError, match=message):
        _load(path, False)
    with pytest.raises(CheckpointError, match=message):  # the pinned host store checks as it reads
        _load(path, True)


def test_mmap_store_checks_an_expert_at_its_first_use(copy_checkpoint, tiny_model):
    path = copy_checkpoint(_poisoned(tiny_model, EXPERT, float("nan"), at=(0, 0)))
    files = sorted(str(p) for p in path.glob("*.safetensors"))
    cfg = tiny_model.config
    layers = [1, 2, 3]
    store = ExpertStore.from_safetensors(files, layers, cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size,
                                         torch.float32, mode="mmap")
    assert torch.isfinite(store.weights(1, 4)[1]).all()  # layer 2 is MoE index 1; expert 4 is clean
    with pytest.raises(CheckpointError, match=rf"{re.escape(EXPERT)} holds 1 non-finite"):
        store.weights(1, 5)
    with pytest.raises(CheckpointError, match=rf"{re.escape(EXPERT)} holds 1 non-finite"):
        store.weights(1, 5)  # still refused on the next use


def test_clean_checkpoint_still_loads_and_matches(copy_checkpoint, tiny_model):
    model = _load(copy_checkpoint(), True)
    assert torch.equal(model.model.layers[1].mlp.gate.expert_bias, tiny_model.model.layers[1].mlp.gate.expert_bias)


@pytest.mark.parametrize("value", [0.0, 1.0, -3.0e38, 6.0e4, float("nan"), float("inf")])
def test_first_non_finite_finds_exactly_the_bad_values(value):
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        t = torch.zeros(4, 5, dtype=dtype)
        t[2, 3] = value
        found = first_non_finite(t)
        expected = None if torch.isfinite(t).all() else (1, [2, 3])
        assert found == expected, (dtype, value)
    assert first_non_finite(torch.empty(0)) is None and first_non_finite(torch.tensor(float("nan"))) == (1, [])


# --- the shard index ---------------------------------------------------------------------------------------------

def _retarget(path, target: str, tensor: str = "lm_head.weight") -> None:
    index = json.loads((path / INDEX).read_text())
    index["weight_map"][tensor] = target
    (path / INDEX).write_text(json.dumps(index))


@pytest.mark.parametrize("offloaded", [False, True], ids=["resident", "offloaded"])
@pytest.mark.parametrize("target", ["../outside.safetensors", "ABSOLUTE", "sub/model.safetensors", ".."],
                         ids=["parent", "absolute", "subfolder", "dotdot"])
def test_index_naming_a_file_outside_the_folder_is_refused(copy_checkpoint, tmp_path, offloaded, target):
    path = copy_checkpoint()
    shard = _weight_map(path)["lm_head.weight"]
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes((path / shard).read_bytes())
    (path / "sub").mkdir()
    (path / "sub" / "model.safetensors").write_bytes((path / shard).read_bytes())
    target = str(outside) if target == "ABSOLUTE" else target
    _retarget(path, target)
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(path / INDEX))}: not a valid shard index: tensor "
                                              rf"lm_head.weight is mapped to {re.escape(repr(target))}, which is not "
                                              r"a file name in the checkpoint folder"):
        _load(path, offloaded)


@pytest.mark.parametrize("offloaded", [False, True], ids=["resident", "offloaded"])
@pytest.mark.parametrize("target", ["config.json", INDEX, "tokenizer.json"])
def test_index_naming_a_file_that_is_not_a_shard_is_refused(copy_checkpoint, offloaded, target):
    """Issue 67 item 16: an expert mapped to config.json or to the index itself gave a raw "Weights only load failed"
    or "header too large", naming no file."""
    path = copy_checkpoint()
    tensor = next(name for name in _weight_map(path) if ".experts." in name)
    _retarget(path, target, tensor)
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(path / INDEX))}: not a valid shard index: tensor "
                                              rf"{re.escape(tensor)} is mapped to {re.escape(repr(target))}, which is "
                                              r"not a weight shard; a safetensors index names \*\.safetensors files$"):
        _load(path, offloaded)


def test_a_symlinked_shard_still_loads(copy_checkpoint, tmp_path, tiny_model):
    """``oled-moe prepare`` and the Hugging Face cache link shards to files kept elsewhere: allowed."""
    path = copy_checkpoint()
    shard = _weight_map(path)["lm_head.weight"]
    elsewhere = tmp_path / "blobs"
    elsewhere.mkdir()
    os.replace(path / shard, elsewhere / shard)
    (path / shard).symlink_to(elsewhere / shard)
    assert torch.equal(_load(path, False).lm_head.weight, tiny_model.lm_head.weight)


@pytest.mark.parametrize("offloaded", [False, True], ids=["resident", "offloaded"])
def test_empty_weight_map_is_a_clear_error(copy_checkpoint, offloaded):
    path = copy_checkpoint()
    (path / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": {}}))
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(path / INDEX))}: not a valid shard index: its "
                                              r"\"weight_map\" is empty"):
        _load(path, offloaded)


# --- shard contents ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("offloaded", [False, True], ids=["resident", "offloaded"])
def test_trailing_junk_after_a_shard_names_the_file(copy_checkpoint, offloaded):
    path = copy_checkpoint()
    shard = path / _weight_map(path)["lm_head.weight"]
    with open(shard, "ab") as f:
        f.write(b"junk!")
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(shard))}: not a valid safetensors file: 5 bytes of "
                                              r"trailing data follow the last tensor"):
        _load(path, offloaded)


def test_overlapping_tensors_are_refused(tmp_path):
    path = tmp_path / "x.safetensors"
    save_file({"a": torch.zeros(2), "b": torch.ones(2)}, path)
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    header["b"]["data_offsets"] = [0, 8]  # b aliases a; 8 bytes at the end are left unused
    raw = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    assert len(raw) == n
    path.write_bytes(data[:8] + raw + data[8 + n :])
    with pytest.raises(CheckpointError, match=r"tensor '.' starts at byte 0 of the data but the previous tensor "
                                              r"'.' ends at 8: it overlaps another tensor"):
        read_safetensors_header(path)


def test_safetensors_decides_validity_and_its_reason_is_kept(tmp_path):
    """A dtype the library accepts is accepted (it once was refused as unknown), and a refusal
    carries the library's own reason beside the file, tensor and bytes."""
    path = tmp_path / "fnuz.safetensors"
    save_file({"a": torch.zeros(4, dtype=torch.float8_e4m3fnuz)}, path)
    header, start = read_safetensors_header(path)
    assert header == {"a": {"dtype": "F8_E4M3FNUZ", "shape": [4], "data_offsets": [0, 4]}}
    assert start == path.stat().st_size - 4
    with open(path, "ab") as f:
        f.write(b"x")
    with pytest.raises(CheckpointError, match=r"1 bytes of trailing data .* \(safetensors: incomplete metadata, "
                                              r"file not fully covered\)$"):
        read_safetensors_header(path)


@pytest.mark.parametrize("name, shape", [("model.norm.weight", (129,)), (BIAS, (63,)), ("lm_head.weight", (512, 64))])
def test_resident_shape_mismatch_names_tensor_file_and_both_shapes(copy_checkpoint, tiny_model, name, shape):
    expected = list(tiny_model.state_dict()[name].shape)
    path = copy_checkpoint({name: torch.zeros(shape)})
    shard = re.escape(str(path / _weight_map(path)[name]))
    with pytest.raises(CheckpointError, match=rf"^{shard}: tensor {re.escape(name)} has shape "
                                              rf"{re.escape(str(list(shape)))} but the model built from config.json "
                                              rf"expects {re.escape(str(expected))}"):
        _load(path, False)


def test_ignore_mismatched_sizes_is_the_opt_out(copy_checkpoint):
    path = copy_checkpoint({"model.norm.weight": torch.zeros(129)})
    model = _load(path, False, ignore_mismatched_sizes=True)
    assert model.model.norm.weight.shape == (128,)


def test_offloaded_expert_shape_mismatch_names_the_file(copy_checkpoint, tiny_model):
    shape = tuple(tiny_model.state_dict()[EXPERT].shape)
    path = copy_checkpoint({EXPERT: torch.zeros(shape[0] + 1, shape[1])})
    shard = re.escape(str(path / _weight_map(path)[EXPERT]))
    with pytest.raises(CheckpointError, match=rf"^{shard}: tensor {re.escape(EXPERT)} has shape \[{shape[0] + 1}, "):
        _load(path, True)


def test_copy_checkpoint_edits_really_land(copy_checkpoint, tiny_model):
    """Guard for the tests above: the fixture writes the poisoned tensor where the index says."""
    path = copy_checkpoint(_poisoned(tiny_model, BIAS, float("nan")))
    assert torch.isnan(load_file(path / _weight_map(path)[BIAS])[BIAS]).sum() == 1


# --- tokenizer vs model ------------------------------------------------------------------------------------------

def test_the_checkpoints_own_tokenizers_match(tiny_model, tiny_tokenizer):
    from transformers import AutoConfig, GenerationConfig

    from oled_hf.checkpoints.tokenizer import check_tokenizer_matches, load_tokenizer
    from oled_hf.toy import TOY_CHECKPOINT

    check_tokenizer_matches(tiny_tokenizer, tiny_model.config, tiny_model.generation_config, "tiny")
    for folder in (TOY_CHECKPOINT, TOY_CHECKPOINT.parent / "long" / "checkpoint"):
        check_tokenizer_matches(load_tokenizer(folder), AutoConfig.from_pretrained(folder),
                                GenerationConfig.from_pretrained(folder), folder)


def test_a_tokenizer_smaller_than_a_padded_vocabulary_is_allowed(tiny_model, tiny_tokenizer):
    """Official checkpoints pad vocab_size above the tokenizer's length (157184 for LLaDA2.0-mini)."""
    from oled_hf.checkpoints.tokenizer import check_tokenizer_matches

    padded = tiny_model.config.to_dict() | {"vocab_size": 640}
    check_tokenizer_matches(tiny_tokenizer, type(tiny_model.config)(**padded), None, "padded")


@pytest.mark.parametrize("size, message", [
    (600, r"^ckpt: the tokenizer has 600 tokens but the model's vocab_size is 512 \(config.json\): ids 512 to 599 "
          r"have no embedding"),
    (400, r"^ckpt: the model's mask_token_id=511 \(config.json\) is not a token of its tokenizer, which has 400 "
          r"tokens"),
])
def test_a_tokenizer_of_another_vocabulary_is_refused(tmp_path, tiny_model, size, message):
    from oled_hf.checkpoints.tokenizer import build_tokenizer, check_tokenizer_matches

    tokenizer = build_tokenizer(tmp_path / "tok", size)
    with pytest.raises(ValueError, match=message):
        check_tokenizer_matches(tokenizer, tiny_model.config, tiny_model.generation_config, "ckpt")


def test_a_special_id_beyond_the_vocabulary_is_refused(tiny_model, tiny_tokenizer):
    from types import SimpleNamespace

    from oled_hf.checkpoints.tokenizer import check_tokenizer_matches

    small = SimpleNamespace(vocab_size=len(tiny_tokenizer), mask_token_id=0, eos_token_id=1, pad_token_id=1)
    class Tok(SimpleNamespace):
        def __len__(self):
            return len(tiny_tokenizer)

    fake = Tok(eos_token_id=len(tiny_tokenizer) + 3, mask_token_id=None, pad_token_id=None, bos_token_id=None)
    with pytest.raises(ValueError, match=rf"the tokenizer's eos_token_id={len(tiny_tokenizer) + 3} is outside the "
                                         rf"model's vocabulary \(allowed: 0 to {len(tiny_tokenizer) - 1}"):
        check_tokenizer_matches(fake, small)


def test_load_tokenizer_with_its_model_refuses_a_mismatched_pair(tmp_path, tiny_model):
    """The loaders (lm-eval adapter, server, demo) pass the model, so a wrong pair fails at load."""
    from oled_hf.checkpoints.tokenizer import build_tokenizer, load_tokenizer

    build_tokenizer(tmp_path / "tok", 600)
    with pytest.raises(ValueError, match=r"the tokenizer has 600 tokens but the model's vocab_size is 512"):
        load_tokenizer(tmp_path / "tok", model=tiny_model)
    assert len(load_tokenizer(tmp_path / "tok")) == 600  # without the model: only the tokenizer's own checks
