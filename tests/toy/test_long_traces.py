"""``python -m oled_hf.toy.long.traces``: OUT checked before the model loads, the trace written whole or not at all."""

import errno

import pytest

from oled_hf import fileio
from oled_hf.toy.long import traces


@pytest.fixture
def no_model(monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("nothing may load"))


def test_an_existing_trace_is_refused_before_the_model_loads(tmp_path, capsys, no_model):
    out = tmp_path / "t.pt"
    out.write_text("mine")
    with pytest.raises(SystemExit) as exit_:
        traces.main([str(out), "--n-per-task", "1", "--quiet"])
    assert exit_.value.code == 2
    assert f"out={str(out)!r} already exists; pass --overwrite to replace it" in capsys.readouterr().err
    assert out.read_text() == "mine"


def test_a_missing_folder_is_refused_not_created(tmp_path, no_model):
    with pytest.raises(ValueError, match="does not exist; create it first"):
        traces.record_trace(tmp_path / "new" / "t.pt", n_per_task=1, quiet=True)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_keeps_the_old_trace_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    out = tmp_path / "t.pt"
    out.write_text("old")

    def full_disk(path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileio, "_fsync", full_disk)
    with pytest.raises(OSError, match=f"could not write {out}: No space left on device"):
        traces.record_trace(out, n_per_task=1, quiet=True, overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["t.pt"] and out.read_text() == "old"
