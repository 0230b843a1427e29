"""``save_llada2_tokenizer`` on its own: the tokenizer files are written whole or not at all, links replaced."""

import errno

import pytest

from oled_hf import fileio
from oled_hf.checkpoints.tokenizer import build_tokenizer

V = 600


def test_a_failed_save_keeps_the_old_tokenizer_and_leaves_nothing_behind(tmp_path, monkeypatch):
    folder = tmp_path / "tok"
    build_tokenizer(folder, V)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    (folder / "tokenizer.json").write_text('{"old": true}')
    before["tokenizer.json"] = b'{"old": true}'

    def full_disk(path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileio, "_fsync", full_disk)
    with pytest.raises(OSError, match=f"could not write {folder}: No space left on device"):
        build_tokenizer(folder, V)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["tok"]


def test_a_failed_save_into_a_new_folder_leaves_no_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(fileio, "_fsync", lambda path: (_ for _ in ()).throw(OSError(errno.EFBIG, "File too large")))
    with pytest.raises(OSError, match="File too large"):
        build_tokenizer(tmp_path / "a" / "tok", V)
    assert list(tmp_path.iterdir()) == []


def test_a_link_at_a_tokenizer_file_is_replaced_not_written_through(tmp_path):
    victim = tmp_path / "victim.json"
    victim.write_text("another checkpoint's tokenizer")
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").symlink_to(victim)
    tok = build_tokenizer(tmp_path / "tok", V)
    assert victim.read_text() == "another checkpoint's tokenizer" and len(tok) == V
    assert not (tmp_path / "tok" / "tokenizer.json").is_symlink()
