"""The toy data writers (toy.data, toy.long.data): refuse what exists, write whole or not at all."""

import errno

import pytest

from oled_hf.toy import data
from oled_hf.toy.long import data as long_data
from oled_hf.toy.long.tasks import DEFAULT_MIX


def _fail_while_building(monkeypatch, after: str):
    """The second file's write fails on a full disk, after the first was written."""
    from pathlib import Path

    real = Path.write_text

    def write_text(self, text, *a, **k):
        if self.name == after and ".tmp" in str(self.parent):
            real(self, text[:10], *a, **k)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, text, *a, **k)

    monkeypatch.setattr(Path, "write_text", write_text)


def test_toy_data_refuses_existing_files_and_missing_trees(tmp_path):
    (tmp_path / "test.jsonl").write_text("mine")
    with pytest.raises(ValueError, match=r"already holds test.jsonl; pass overwrite=True \(--overwrite\)"):
        data.write_jsonl(tmp_path, 5, 5)
    assert [p.name for p in tmp_path.iterdir()] == ["test.jsonl"] and (tmp_path / "test.jsonl").read_text() == "mine"
    with pytest.raises(ValueError, match="does not exist; create it first"):
        data.write_jsonl(tmp_path / "a" / "b", 5, 5)
    assert not (tmp_path / "a").exists()
    paths = data.write_jsonl(tmp_path, 5, 5, overwrite=True)
    assert len(paths["test"].read_text().splitlines()) == 5


def test_toy_data_failure_leaves_the_old_files(tmp_path, monkeypatch):
    old = data.write_jsonl(tmp_path / "d", 5, 5)
    before = {p.name: p.read_text() for p in old.values()}
    _fail_while_building(monkeypatch, "test.jsonl")
    with pytest.raises(OSError, match=f"could not write {tmp_path / 'd'}: No space left on device"):
        data.write_jsonl(tmp_path / "d", 7, 7, overwrite=True)
    assert {p.name: p.read_text() for p in (tmp_path / "d").iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["d"]  # no temporary folder left


def test_toy_data_main_is_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "train.jsonl").write_text("mine")
    with pytest.raises(SystemExit) as exit_:
        data.main([str(tmp_path), "--n-train", "3", "--n-heldout", "3"])
    assert exit_.value.code == 2 and "already holds train.jsonl" in capsys.readouterr().err
    data.main([str(tmp_path), "--n-train", "3", "--n-heldout", "3", "--overwrite"])
    assert len((tmp_path / "train.jsonl").read_text().splitlines()) == 3


def test_long_data_checks_every_task_before_writing_any(tmp_path):
    mix = DEFAULT_MIX[:2]
    (tmp_path / mix[1].name).mkdir()
    (tmp_path / mix[1].name / "train.jsonl").write_text("mine")
    with pytest.raises(ValueError, match="already holds train.jsonl; pass overwrite=True"):
        long_data.write_jsonl(tmp_path, mix, n_train=3, n_heldout=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [mix[1].name]  # the first task was not written either
    with pytest.raises(ValueError, match="does not exist; create it first"):
        long_data.write_jsonl(tmp_path / "a" / "b", mix, n_train=3, n_heldout=3)
    paths = long_data.write_jsonl(tmp_path, mix, n_train=3, n_heldout=3, overwrite=True)
    assert len(paths[f"{mix[1].name}/train"].read_text().splitlines()) == 3


def test_long_data_failure_leaves_no_half_task_folder(tmp_path, monkeypatch):
    _fail_while_building(monkeypatch, "test.jsonl")
    with pytest.raises(OSError, match="No space left on device"):
        long_data.write_jsonl(tmp_path / "new", DEFAULT_MIX[:1], n_train=3, n_heldout=3)
    assert list(tmp_path.iterdir()) == []
