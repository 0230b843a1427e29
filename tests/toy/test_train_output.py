"""The toy trainers' output folder: refused before the first step, the checkpoint moved in whole or not at all."""

import errno

import pytest

from oled_hf import fileio
from oled_hf.toy import train as toy_train
from oled_hf.toy import train_toy
from oled_hf.toy.long import REPORT_NAME
from oled_hf.toy.long import train as long_train
from tests.toy.test_long_train import FAST as LONG_FAST
from tests.toy.test_long_train import MIX
from tests.toy.test_toy_train import FAST


def _no_training(monkeypatch, module):
    monkeypatch.setattr(module, "optimizer_step", lambda *a, **k: pytest.fail("no step may run"))


def _full_disk_under(folder):
    real = fileio._fsync

    def fsync(path):
        if str(path).startswith(str(folder)):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path)

    return fsync


def test_a_folder_with_files_is_refused_before_training(tmp_path, monkeypatch, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    _no_training(monkeypatch, toy_train)
    _no_training(monkeypatch, long_train)
    with pytest.raises(ValueError, match="already holds files \\(notes.txt\\).*pass --overwrite"):
        train_toy(tmp_path, steps=1, save=True, **FAST)
    with pytest.raises(ValueError, match="already holds files \\(notes.txt\\)"):
        long_train.train_long(tmp_path, MIX, steps=1, **{**LONG_FAST, "save": True})
    for main in (toy_train.main, long_train.main):
        with pytest.raises(SystemExit) as exit_:
            main([str(tmp_path), "--steps", "1"])
        assert exit_.value.code == 2 and "already holds files (notes.txt)" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_a_failed_save_leaves_no_partial_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(fileio, "_fsync", _full_disk_under(tmp_path))
    with pytest.raises(OSError, match=f"could not write {tmp_path / 'toy'}: No space left on device"):
        train_toy(tmp_path / "toy", steps=1, save=True, **FAST)
    with pytest.raises(OSError, match=f"could not write {tmp_path / 'long'}: No space left on device"):
        long_train.train_long(tmp_path / "long", MIX, steps=1, **{**LONG_FAST, "save": True})
    assert list(tmp_path.iterdir()) == []


def test_a_failed_save_over_a_checkpoint_keeps_it(tmp_path, monkeypatch):
    out = tmp_path / "ckpt"
    long_train.train_long(out, MIX, seed=1, steps=1, **{**LONG_FAST, "save": True})
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert REPORT_NAME in before and "tokenizer.json" in before and "config.json" in before
    monkeypatch.setattr(fileio, "_fsync", _full_disk_under(tmp_path))
    with pytest.raises(OSError, match="No space left on device"):
        long_train.train_long(out, MIX, seed=2, steps=1, overwrite=True, **{**LONG_FAST, "save": True})
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
