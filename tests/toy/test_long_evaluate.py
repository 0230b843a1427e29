"""``python -m oled_hf.toy.long.evaluate`` outputs: refused before the model loads, written whole or not at all."""

import errno
import json
import shutil

import pytest

from oled_hf import fileio
from oled_hf.toy.long import LONG_CHECKPOINT, REPORT_NAME
from oled_hf.toy.long import evaluate as long_evaluate

QUICK = ["--n", "1", "--settings", "16:0.95", "--batch-size", "1", "--threads", "1"]


def test_an_existing_json_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("nothing may load"))
    out = tmp_path / "figures.json"
    out.write_text("mine")
    with pytest.raises(SystemExit) as exit_:
        long_evaluate.main([str(LONG_CHECKPOINT), *QUICK, "--json", str(out)])
    assert exit_.value.code == 2
    assert f"--json={str(out)!r} already exists; pass --overwrite to replace it" in capsys.readouterr().err
    assert out.read_text() == "mine"


def test_a_failed_report_update_keeps_the_old_report(tmp_path, monkeypatch):
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(LONG_CHECKPOINT, checkpoint)
    before = (checkpoint / REPORT_NAME).read_text()
    names = sorted(p.name for p in checkpoint.iterdir())
    out = tmp_path / "figures.json"

    def full_disk(path):
        if str(path).startswith(str(checkpoint)):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileio, "_fsync", full_disk)
    with pytest.raises(OSError, match=f"could not write {checkpoint / REPORT_NAME}: No space left on device"):
        long_evaluate.main([str(checkpoint), *QUICK, "--json", str(out), "--update-report"])
    assert (checkpoint / REPORT_NAME).read_text() == before and sorted(p.name for p in checkpoint.iterdir()) == names
    assert json.loads(out.read_text())["n_per_task"] == 1  # the --json file was written whole
