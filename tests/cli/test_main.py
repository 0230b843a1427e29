"""Every subcommand of ``oled-moe``, found by walking the argparse tree (a new subcommand is covered
without editing this file): a ``--device`` this machine lacks and a ``--model`` whose ``~user``
cannot be expanded are one line on stderr and exit status 2, before any weight is read."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from oled_hf.cli.main import build_parser, main, subparsers_of

PROMPTS = Path(__file__).resolve().parents[2] / "eval" / "prompts.txt"


def commands_with(flag: str) -> list[tuple[list[str], argparse.ArgumentParser]]:
    """``(["trace", "record"], parser)`` for every leaf parser that takes ``flag``."""
    found = []
    for parser in subparsers_of(build_parser()):
        if any(flag in action.option_strings for action in parser._actions):
            found.append((parser.prog.split()[1:], parser))
    return found


def required_arguments(parser: argparse.ArgumentParser, tmp_path: Path) -> list[str]:
    """Values for a parser's required options and positionals, so that it reaches its own checks.

    A subcommand with a required argument not known here fails the test, naming it: add a value
    that lets the command get past its argument checks. A command with budget flags gets one
    (``benchmark`` needs a budget to compare).
    """
    values = {"prompts": str(PROMPTS), "out": str(tmp_path / "unused.out"), "tasks": "toy_addition"}
    argv: list[str] = []
    if any("--cache-size" in action.option_strings for action in parser._actions):
        argv += ["--cache-size", "4"]
    for action in parser._actions:
        if isinstance(action, (argparse._SubParsersAction, argparse._HelpAction)):
            continue
        positional = not action.option_strings
        if not (action.required or (positional and action.nargs not in ("?", "*"))):
            continue
        assert action.dest in values, f"{parser.prog}: give the walk a value for its required {action.dest!r}"
        argv += [values[action.dest]] if positional else [action.option_strings[0], values[action.dest]]
    return argv


def test_the_walk_finds_every_model_loading_command():
    found = {" ".join(words) for words, _ in commands_with("--device")}
    assert {"demo", "chat", "serve", "benchmark", "eval", "trace record"} <= found
    assert {" ".join(words) for words, _ in commands_with("--model")} == found


@pytest.fixture
def nothing_loads(monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("nothing may load"))


@pytest.mark.parametrize("words, parser", commands_with("--device"), ids=lambda v: " ".join(v) if
                         isinstance(v, list) else "")
def test_device_cuda_without_cuda_is_one_line_exit_2(words, parser, tiny_path, tmp_path, capsys, monkeypatch,
                                                    nothing_loads):
    """Issue 35 item 2: chat and serve printed a 44-line traceback (they skipped common.resolve_device)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code = main([*words, "--model", str(tiny_path), "--device", "cuda", *required_arguments(parser, tmp_path)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err == (f"oled-moe {' '.join(words)}: error: --device cuda: CUDA is not available on this machine "
                   "(torch.cuda.is_available() is False); use --device cpu or --device auto\n")


@pytest.mark.parametrize("words, parser", commands_with("--model"), ids=lambda v: " ".join(v) if
                         isinstance(v, list) else "")
def test_model_under_an_unknown_home_folder_is_one_line_exit_2(words, parser, tmp_path, capsys, nothing_loads):
    """Issue 35 item 8: ``--model '~nonexistentuser/x'`` was ``RuntimeError: Could not determine home directory``."""
    code = main([*words, "--model", "~nonexistentuser/x", *required_arguments(parser, tmp_path)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err == (f"oled-moe {' '.join(words)}: error: --model ~nonexistentuser/x: no such folder "
                   "(~nonexistentuser cannot be expanded: there is no user 'nonexistentuser' on this machine)\n")


def test_prepare_source_under_an_unknown_home_folder_is_one_line(tmp_path, capsys):
    """``prepare SRC`` takes a folder or a hub id as ``--model`` does, through the same resolver."""
    assert main(["prepare", "~nonexistentuser/x", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == ("oled-moe prepare: error: SRC ~nonexistentuser/x: no such folder "
                                       "(~nonexistentuser cannot be expanded: there is no user 'nonexistentuser' on "
                                       "this machine)\n")
