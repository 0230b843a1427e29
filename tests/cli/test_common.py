"""The shared model resolver, one-line errors with exit status 2, and every flag's help showing its default."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from oled_hf.cli import common
from oled_hf.cli.main import build_parser, main, subparsers_of

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
# every subcommand that loads a model, with the other arguments it needs
MODEL_COMMANDS = {
    "demo": [], "chat": [], "serve": [], "benchmark": ["--cache-size", "4"], "eval": ["--tasks", "toy_addition"],
    "trace record": ["--prompts", "eval/prompts.txt", "--out", "unused.trace"],
}


def test_resolver_names_the_path_and_what_is_missing(tmp_path, tiny_path, monkeypatch):
    with pytest.raises(ValueError, match=r"--model nowhere: no such folder .*make-tiny"):
        common.resolve_model("nowhere")
    with pytest.raises(ValueError, match=r"config.json is a file, not a checkpoint folder"):
        common.resolve_model(tiny_path / "config.json")
    with pytest.raises(ValueError, match=rf"--model {tmp_path}: no config.json in that folder"):
        common.resolve_model(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json is not readable JSON"):
        common.resolve_model(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="has no model_type"):
        common.resolve_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llada2_moe"}))
    with pytest.raises(ValueError, match=rf"official LLaDA2 checkpoint .*oled-moe prepare {tmp_path} OUT"):
        common.resolve_model(tmp_path)
    assert common.resolve_model(str(tiny_path)) == tiny_path
    monkeypatch.setattr(common, "default_model_path", lambda: tiny_path)
    assert common.resolve_model(None) == tiny_path
    monkeypatch.setattr(common, "default_model_path", lambda: tmp_path / "untrained")
    with pytest.raises(ValueError, match="default toy checkpoint .* is not built"):
        common.resolve_model(None)
    monkeypatch.setattr(common, "default_model_path", lambda: None)
    with pytest.raises(ValueError, match="--model is required"):
        common.resolve_model(None)


def test_every_model_command_reports_a_folder_without_config_in_one_line(tmp_path, capsys):
    for command, extra in MODEL_COMMANDS.items():
        assert main([*command.split(), "--model", str(tmp_path), *extra]) == 2, command
        err = capsys.readouterr().err
        assert err == (f"oled-moe {command}: error: --model {tmp_path}: no config.json in that folder, so it is "
                       f"not a checkpoint ({' '.join(common.MAKE_ONE.split())})\n"), command


def test_demo_never_writes_into_a_model_folder(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"my weights")
    (folder / "tokenizer.json").write_text("{}")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    proc = subprocess.run([sys.executable, "-m", "oled_hf.cli.main", "demo", "--model", str(folder)],
                          capture_output=True, text=True, timeout=120, env=ENV)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"oled-moe demo: error: --model {folder}: no config.json in that folder, so it is not " \
                          f"a checkpoint ({common.MAKE_ONE})\n"
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_a_wrong_model_never_reaches_the_hub_and_a_corrupt_one_is_one_line(tiny_path, tmp_path):
    """The issue's case: a path that is no folder gave a 37-66 line traceback from the hub client."""
    broken = tmp_path / "broken"
    shutil.copytree(tiny_path, broken)
    shard = sorted(broken.glob("*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:100])
    script = ("import sys; from oled_hf.cli.main import main\n"
              "for argv in (['benchmark', '--model', 'no/such/model!', '--cache-size', '4'],\n"
              "             ['trace', 'record', '--model', 'no/such/model!', '--prompts', 'p', '--out', 'o'],\n"
              f"             ['benchmark', '--model', {str(broken)!r}, '--cache-size', '4']):\n"
              "    print(main(argv), file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=ENV)
    lines = proc.stderr.splitlines()
    assert lines[:4] == [
        f"oled-moe benchmark: error: --model no/such/model!: no such folder (give a checkpoint folder with "
        f"config.json; {common.MAKE_ONE})", "2",
        f"oled-moe trace record: error: --model no/such/model!: no such folder (give a checkpoint folder with "
        f"config.json; {common.MAKE_ONE})", "2"]
    assert lines[4].startswith("oled-moe benchmark: error: ") and lines[5] == "2" and len(lines) == 6
    assert "Traceback" not in proc.stderr


def test_debug_shows_the_traceback(tmp_path, capsys):
    assert main(["--debug", "demo", "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and "no config.json" in err.splitlines()[-1]


def test_one_line_joins_multi_line_messages():
    assert common.one_line(OSError("Can't load\n\n  the file\t x")) == "Can't load the file x"
    assert common.one_line(ValueError()) == "ValueError"


def _options(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if action.option_strings and not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            yield action


def test_every_flag_has_help_and_shows_its_default():
    parser = build_parser()
    for sub in [parser, *subparsers_of(parser)]:
        formatter = sub._get_formatter()
        for action in _options(sub):
            name = f"{sub.prog} {action.option_strings[-1]}"
            assert action.help, f"{name} has no help"
            if action.required or action.nargs == 0:  # flags (store_true) and required options: no default
                continue
            assert "default" in formatter._get_help_string(action), f"{name} does not show its default"
    text = subprocess.run([sys.executable, "-m", "oled_hf.cli.main", "benchmark", "--help"], capture_output=True,
                          text=True, timeout=60, env=ENV).stdout
    flat = " ".join(text.split())
    for flag, shown in (("--device", "(default: auto)"), ("--max-new-tokens", "(default: 128)"),
                        ("--runs", "(default: 2)"), ("--warmup-runs", "(default: 1)"),
                        ("--model", "default: the shipped trained toy model")):
        assert flag in flat and shown in flat.split(flag, 1)[1], flag


def test_commands_share_model_and_device_defaults():
    parser = build_parser()
    for command in ("demo", "chat", "serve", "benchmark", "eval", "trace record"):
        args = parser.parse_args([*command.split(), *{"trace record": ["--prompts", "p", "--out", "o"],
                                                      "eval": ["--tasks", "t"]}.get(command, [])])
        assert args.model is None, command  # None: the shipped toy, through common.resolve_model
        if command != "demo":
            assert args.device == "auto", command


def test_the_trained_toy_is_the_default_model():
    default = common.default_model_path()
    assert default is not None and default.name == "checkpoint" and Path(default, "config.json").is_file()


@pytest.mark.parametrize("command", ["benchmark", "trace record", "eval"])
def test_device_cuda_without_cuda_is_one_line_exit_2_everywhere(command, tiny_path, tmp_path, capsys, monkeypatch):
    """Every subcommand resolves --device through common.resolve_device, before anything loads."""
    import torch
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("nothing may load"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "eval").mkdir()
    shutil.copy(Path(__file__).resolve().parents[2] / "eval" / "prompts.txt", tmp_path / "eval" / "prompts.txt")
    code = main([*command.split(), "--model", str(tiny_path), "--device", "cuda", *MODEL_COMMANDS[command]])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "CUDA is not available on this machine" in err and err.count("\n") == 1, err


def test_resolve_device_names_what_is_allowed(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert common.resolve_device("auto") == "cpu" and common.resolve_device("cpu") == "cpu"
    with pytest.raises(ValueError, match=r"^--device gpu: not a device \(allowed: auto, cpu, cuda, cuda:N\)$"):
        common.resolve_device("gpu")
    with pytest.raises(ValueError, match=r"^--device mps: oled-moe runs on cpu or cuda"):
        common.resolve_device("mps")
