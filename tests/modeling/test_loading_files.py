"""Damaged checkpoint files: every error names the file and what is wrong; a bad generation config warns."""

import logging

import pytest
from oled_hf.modeling import OledLLaDA2ForDiffusionLM
from oled_hf.modeling.checkpoint_files import CheckpointError

from oled_hf import OffloadConfig
from oled_hf.checkpoints.tokenizer import load_tokenizer
from oled_hf.offload.store import ExpertStore

SHARD = "model-00002-of-00003.safetensors"


def _truncate(path):
    data = (path / SHARD).read_bytes()
    (path / SHARD).write_bytes(data[: len(data) // 2])


def _cut_header(path):
    (path / SHARD).write_bytes((path / SHARD).read_bytes()[:100])


def _huge_header_length(path):
    data = (path / SHARD).read_bytes()
    (path / SHARD).write_bytes((10**12).to_bytes(8, "little") + data[8:])


def _garble_header(path):
    data = bytearray((path / SHARD).read_bytes())
    data[9:20] = b"x" * 11
    (path / SHARD).write_bytes(bytes(data))


def _write(name, text):
    return lambda path: (path / name).write_text(text)


FAULTS = [
    (_truncate, SHARD, r"not a valid safetensors file: tensor '.*' ends at byte \d+ of the data but the file "
                       r"holds \d+ \(truncated\?\)"),
    (_cut_header, SHARD, r"not a valid safetensors file: the header claims \d+ bytes but the file has 92 after"),
    (_huge_header_length, SHARD, r"not a valid safetensors file: the header claims 1000000000000 bytes"),
    (_garble_header, SHARD, r"not a valid safetensors file: the header is not valid JSON"),
    (_write(SHARD, ""), SHARD, r"not a valid safetensors file: the file is 0 bytes"),
    (_write("model.safetensors.index.json", '{"weight_map": {'), "model.safetensors.index.json",
     r"not a valid shard index: invalid JSON"),
    (_write("model.safetensors.index.json", '{"metadata": {}}'), "model.safetensors.index.json",
     r"not a valid shard index: it needs a \"weight_map\" object"),
    (lambda path: (path / SHARD).unlink(), "model.safetensors.index.json",
     rf"lists shard\(s\) {SHARD} that are not in"),
]


@pytest.mark.parametrize("offloaded", [False, True], ids=["resident", "offloaded"])
@pytest.mark.parametrize("damage, culprit, message", FAULTS, ids=[f[0].__name__ for f in FAULTS])
def test_damaged_weight_files_name_the_file(copy_checkpoint, damage, culprit, message, offloaded):
    path = copy_checkpoint()
    damage(path)
    extra = dict(offload_config=OffloadConfig(cache_size=4)) if offloaded else {}
    with pytest.raises(CheckpointError, match=rf"^{path / culprit}: {message}"):
        OledLLaDA2ForDiffusionLM.from_pretrained(path, **extra)


def test_expert_store_names_a_truncated_shard(copy_checkpoint, tiny_model):
    path = copy_checkpoint()
    _cut_header(path)
    files = sorted(str(p) for p in path.glob("*.safetensors"))
    cfg = tiny_model.config
    with pytest.raises(CheckpointError, match=rf"^{path / SHARD}: not a valid safetensors file"):
        ExpertStore.from_safetensors(files, [1, 2, 3], cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size,
                                     tiny_model.dtype)


@pytest.mark.parametrize("name, text, message", [
    ("tokenizer.json", '{"version": "1.0", ', r"tokenizer.json: not a valid tokenizer file: invalid JSON"),
    ("tokenizer.json", '{"version": "1.0", "model": {"type": "Nope"}}',
     r": the tokenizer \(tokenizer.json, tokenizer_config.json\) could not be loaded"),
    ("tokenizer_config.json", "[1]", r"tokenizer_config.json: not a valid tokenizer config: a JSON list"),
])
def test_corrupt_tokenizer_names_the_file(copy_checkpoint, name, text, message):
    path = copy_checkpoint()
    (path / name).write_text(text)
    with pytest.raises(CheckpointError, match=rf"^{path}.*{message}"):
        load_tokenizer(path)


def test_corrupt_generation_config_warns_and_uses_defaults(copy_checkpoint, caplog):
    path = copy_checkpoint()
    (path / "generation_config.json").write_text('{"block_length": ')
    with caplog.at_level(logging.WARNING):
        model = OledLLaDA2ForDiffusionLM.from_pretrained(path)
    assert f"{path / 'generation_config.json'} could not be read" in caplog.text
    assert "generate uses block-diffusion defaults" in caplog.text
    assert getattr(model.generation_config, "block_length", None) is None  # the file's values were not used


def test_cli_prints_the_file_and_exits_2(copy_checkpoint, capsys):
    from oled_hf.cli.main import main

    path = copy_checkpoint()
    _garble_header(path)
    assert main(["benchmark", "--model", str(path), "--cache-size", "4", "--max-new-tokens", "8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"oled-moe benchmark: error: {path / SHARD}: not a valid safetensors file") and \
        "Traceback" not in err
    (path / "tokenizer.json").write_text("{")
    assert main(["benchmark", "--model", str(path), "--cache-size", "4", "--max-new-tokens", "8"]) == 2
    assert capsys.readouterr().err.startswith(f"oled-moe benchmark: error: {path / 'tokenizer.json'}: not a valid")

