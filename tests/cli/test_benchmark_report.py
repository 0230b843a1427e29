"""``benchmark --report-dir``: an existing report.json is refused before any work; a write is whole or nothing."""

import errno
import json

import pytest

from oled_hf import fileio
from oled_hf.cli.main import main

QUICK = ["--max-new-tokens", "8", "--block-length", "8", "--cache-size", "8", "--system", "lru", "--runs", "1",
         "--warmup-runs", "0", "--prompt", "hi", "--json", "--quiet"]


def test_an_existing_report_is_refused_before_any_model_loads(tiny_path, tmp_path, capsys, monkeypatch):
    from transformers import AutoModelForCausalLM

    (tmp_path / "report.json").write_text("mine")
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("nothing may load"))
    code = main(["benchmark", "--model", str(tiny_path), *QUICK, "--report-dir", str(tmp_path)])
    assert code == 2
    assert capsys.readouterr().err == (f"oled-moe benchmark: error: --report-dir={str(tmp_path)!r} already holds "
                                       "report.json; pass --overwrite to replace it, or choose a new folder\n")
    assert (tmp_path / "report.json").read_text() == "mine"


def test_a_missing_folder_tree_is_refused(tiny_path, tmp_path, capsys):
    code = main(["benchmark", "--model", str(tiny_path), *QUICK, "--report-dir", str(tmp_path / "a" / "b")])
    assert code == 2 and "does not exist; create it first" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_keeps_the_old_report_and_leaves_no_temporary_file(tiny_path, tmp_path, capsys, monkeypatch):
    (tmp_path / "report.json").write_text("old")

    def full_disk(path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileio, "_fsync", full_disk)
    code = main(["benchmark", "--model", str(tiny_path), *QUICK, "--report-dir", str(tmp_path), "--overwrite"])
    err = capsys.readouterr().err
    assert code == 2
    assert err == (f"oled-moe benchmark: error: [Errno 28] could not write {tmp_path / 'report.json'}: No space "
                   "left on device; nothing was written there\n")
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"] and (tmp_path / "report.json").read_text() == "old"


def test_the_report_folder_is_made_when_its_parent_exists(tiny_path, tmp_path, capsys):
    code = main(["benchmark", "--model", str(tiny_path), *QUICK, "--report-dir", str(tmp_path / "new")])
    assert code == 0
    assert json.loads((tmp_path / "new" / "report.json").read_text())["rows"][0]["config"] == "full residency"
