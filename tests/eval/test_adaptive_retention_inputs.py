"""Issue 67 item 18: eval/adaptive_retention.py with a missing, empty or mismatched trace stopped with a traceback,
and only after minutes of its synthetic study; now one line (argparse's error, exit 2) before any work. And the
adaptive retention's ``candidates`` knob of a wrong type is its one-line ValueError, not a TypeError."""

from __future__ import annotations

import sys

import pytest

from oled_hf.cli.main import main as oled_moe
from oled_hf.offload.policies.adaptive import AdaptivePolicy
from oled_hf.offload.system import build_policy, parse_system
from tests.eval_scripts import load_eval_script


def synth(path, layers: int) -> str:
    assert oled_moe(["trace", "synth", "--out", str(path), "--layers", str(layers), "--experts", "16", "--top-k", "2",
                     "--block-length", "4", "--blocks", "2", "--sequences", "3"]) == 0
    return str(path)


def run(monkeypatch, capsys, *argv: str) -> str:
    script = load_eval_script("adaptive_retention")
    monkeypatch.setattr(script, "synthetic_run", lambda *a: pytest.fail("the study started before the inputs"))
    monkeypatch.setattr(sys, "argv", ["adaptive_retention.py", "--sequences", "2", "--warmup", "1", *argv])
    with pytest.raises(SystemExit) as info:
        script.main()
    assert info.value.code == 2
    return capsys.readouterr().err.splitlines()[-1]


def test_bad_traces_are_one_line_before_any_work(tmp_path, monkeypatch, capsys):
    a, b = synth(tmp_path / "a.trace", 2), synth(tmp_path / "b.trace", 3)
    empty = tmp_path / "empty.trace"
    empty.write_bytes(b"")
    capsys.readouterr()
    prefix = "adaptive_retention.py: error: --traces "
    none = tmp_path / "none.trace"
    assert run(monkeypatch, capsys, "--traces", str(none)) == f"{prefix}{none}: no such file"
    assert run(monkeypatch, capsys, "--traces", str(empty)).startswith(f"{prefix}{empty}: the file is empty")
    assert run(monkeypatch, capsys, "--traces", a, b) == (
        f"{prefix}(0: {a}, 1: {b}): trace 1 has num_moe_layers=3, trace 0 has num_moe_layers=2: only traces with the "
        "same num_moe_layers, num_experts, top_k can be concatenated")
    assert run(monkeypatch, capsys, "--traces", a, "--warmup", "3", "--sequences", "4") == (
        f"{prefix}{a}: 3 sequence(s), none left after --warmup 3; record more or lower --warmup")


@pytest.mark.parametrize("value", [None, 5, [1, "lru"], {"oled": 1}])
def test_candidates_of_a_wrong_type_are_the_one_line_valueerror(value):
    with pytest.raises(ValueError, match=r"^adaptive candidates=.* is invalid: distinct names from oled, lru"):
        AdaptivePolicy(2, 8, candidates=value)
    system = parse_system("adaptive").with_knobs(**{"retention.candidates": value})
    with pytest.raises(ValueError, match=r"^adaptive candidates="):  # as a system's knob: retention.candidates=...
        build_policy(system, 2, 8)
