"""lm-eval runs in a log: git's noise gone, request bars as progress lines, everything put back after."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from oled_hf.evaluation import quiet


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_git_lookup_outside_a_clone_prints_nothing(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # tmp_path is in no clone
    from lm_eval.loggers.utils import get_git_commit_hash

    try:
        assert get_git_commit_hash() is None  # lm-eval's own: the noise this module removes
    except FileNotFoundError:
        pytest.skip("no git on this machine")
    assert "fatal: not a git repository" in capfd.readouterr().err
    assert quiet.git_commit_hash() is None
    assert capfd.readouterr().err == ""


def test_patches_hold_only_inside_and_only_in_a_pipe(monkeypatch):
    import lm_eval.api.task
    import lm_eval.evaluator
    import lm_eval.models.huggingface

    originals = (lm_eval.evaluator.get_git_commit_hash, lm_eval.models.huggingface.tqdm, lm_eval.api.task.tqdm)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with quiet.lm_eval_quiet():
        assert lm_eval.evaluator.get_git_commit_hash is quiet.git_commit_hash
        assert lm_eval.api.task.tqdm is quiet.no_bar
        bar = lm_eval.models.huggingface.tqdm(total=3, disable=False, desc="Running generate_until requests")
        for _ in range(3):
            bar.update(1)
        bar.close()
    assert sys.stderr.getvalue().startswith("Running generate_until requests: done, 3/3 request in ")
    assert (lm_eval.evaluator.get_git_commit_hash, lm_eval.models.huggingface.tqdm,
            lm_eval.api.task.tqdm) == originals
    monkeypatch.setattr(sys, "stderr", Terminal())
    with quiet.lm_eval_quiet():  # a terminal keeps lm-eval's bars; the git noise goes anyway
        assert lm_eval.models.huggingface.tqdm is originals[1]
        assert lm_eval.evaluator.get_git_commit_hash is quiet.git_commit_hash


def test_quiet_silences_the_request_bars_on_a_terminal(monkeypatch):
    import lm_eval.models.huggingface

    from oled_hf.evaluation import lm_eval_adapter

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with quiet.lm_eval_quiet(quiet=True):
        for make in (lm_eval.models.huggingface.tqdm, lambda **k: lm_eval_adapter.progress(**k)):
            bar = make(total=2, desc="requests")
            bar.update(2)
            bar.close()
    assert terminal.getvalue() == ""
    assert lm_eval_adapter.progress is quiet.progress  # put back


def test_git_still_names_the_commit_inside_a_clone(tmp_path, monkeypatch):
    try:
        subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                        "--allow-empty", "-m", "x"], check=True)
    except (FileNotFoundError, subprocess.CalledProcessError):
        pytest.skip("no usable git on this machine")
    monkeypatch.chdir(tmp_path)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert quiet.git_commit_hash() == head
