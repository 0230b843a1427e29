"""``oled-moe eval --output-path``: checked before the run, written whole or not at all, never replaced silently."""

import errno
import json

import pytest

from oled_hf import fileio
from oled_hf.cli.main import main


@pytest.fixture
def fake_lm_eval(monkeypatch):
    """make_lm / evaluate / make_table replaced: these tests are about where the results go, in milliseconds."""
    pytest.importorskip("lm_eval")
    import lm_eval.utils

    from oled_hf.evaluation import runner

    calls = []
    monkeypatch.setattr(runner, "make_lm", lambda *a, **k: calls.append("make_lm"))
    monkeypatch.setattr(runner, "evaluate", lambda *a, **k: {"config": {}, "results": {"t": {"acc": 0.5}}})
    monkeypatch.setattr(lm_eval.utils, "make_table", lambda *a, **k: "table")
    return calls


def _eval(tiny_path, *flags):
    return main(["eval", "--model", str(tiny_path), "--tasks", "toy_addition", "--quiet", *flags])


def test_an_existing_json_is_refused_before_any_work(tiny_path, tmp_path, capsys, fake_lm_eval):
    out = tmp_path / "res.json"
    out.write_text("mine")
    assert _eval(tiny_path, "--output-path", str(out)) == 2
    assert capsys.readouterr().err == (f"oled-moe eval: error: --output-path={str(out)!r} already exists; pass "
                                       "--overwrite to replace it, or choose a new path\n")
    assert fake_lm_eval == [] and out.read_text() == "mine"
    assert _eval(tiny_path, "--output-path", str(tmp_path / "no" / "res.json")) == 2
    assert "does not exist; create it first" in capsys.readouterr().err and fake_lm_eval == []


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary_file(tiny_path, tmp_path, capsys, monkeypatch,
                                                                       fake_lm_eval):
    out = tmp_path / "res.json"
    out.write_text("old")

    def full_disk(path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileio, "_fsync", full_disk)
    assert _eval(tiny_path, "--output-path", str(out), "--overwrite") == 2
    assert capsys.readouterr().err.endswith(f"error: [Errno 28] could not write {out}: No space left on device; "
                                            "nothing was written there\n")
    assert [p.name for p in tmp_path.iterdir()] == ["res.json"] and out.read_text() == "old"


def test_runs_into_one_folder_keep_every_result(tiny_path, tmp_path, capsys, fake_lm_eval):
    folder = tmp_path / "results"
    for _ in range(2):  # the same second: the same timestamp
        assert _eval(tiny_path, "--output-path", str(folder)) == 0
    files = sorted(folder.iterdir())
    assert len(files) == 2 and all(json.loads(f.read_text())["results"]["t"]["acc"] == 0.5 for f in files)
    assert _eval(tiny_path, "--output-path", str(tmp_path / "a" / "b")) == 2  # no tree from a typo
    assert not (tmp_path / "a").exists()
