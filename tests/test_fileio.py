"""The shared write helpers: a file or folder is written whole or not at all, never through a link."""

from __future__ import annotations

import errno
import resource

import pytest

from oled_hf.fileio import (
    check_new_file,
    check_writable_folder,
    write_atomically,
    write_bytes_atomically,
    write_folder_atomically,
)
from tests.read_only import read_only


def test_a_failed_write_leaves_neither_target_nor_temporary_file(tmp_path):
    target = tmp_path / "out.bin"

    def save(tmp):
        with open(tmp, "wb") as fh:
            fh.write(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError) as err:
        write_atomically(save, target)
    assert str(err.value) == f"[Errno 28] could not write {target}: No space left on device; nothing was written there"
    assert err.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    def save(tmp):
        with open(tmp, "w") as fh:
            fh.write("new")
        raise RuntimeError("a bug in the writer")

    with pytest.raises(RuntimeError, match="a bug in the writer"):
        write_atomically(save, target)
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_ulimit_f_is_an_oserror_naming_the_target(tmp_path):
    target = tmp_path / "big.bin"
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        with pytest.raises(OSError) as err:
            write_bytes_atomically(b"x" * 100_000, target)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert str(err.value) == (f"[Errno {errno.EFBIG}] could not write {target}: File too large; nothing was "
                              "written there")
    assert list(tmp_path.iterdir()) == []


def test_a_link_at_the_target_is_replaced_never_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = tmp_path / "link"
    link.symlink_to(victim)
    write_bytes_atomically(b"new", link)
    assert victim.read_text() == "precious" and not link.is_symlink() and link.read_bytes() == b"new"
    assert link.stat().st_mode & 0o777 == 0o644


def test_check_new_file_refuses_what_it_could_not_write(tmp_path):
    (tmp_path / "f").write_text("mine")
    with pytest.raises(ValueError, match=r"out='.*f' already exists; pass --overwrite to replace it"):
        check_new_file(tmp_path / "f", overwrite=False, field="out", flag="--overwrite")
    assert check_new_file(tmp_path / "f", overwrite=True) == tmp_path / "f"
    with read_only(tmp_path / "ro") as ro:
        with pytest.raises(ValueError, match=rf"path='{ro}/t': its folder '{ro}' is not writable \("):
            check_new_file(ro / "t", overwrite=True)
        with pytest.raises(ValueError, match=rf"dir='{ro}' is not writable"):
            check_writable_folder(ro, field="dir")
        assert list(ro.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f", "ro"]  # no probe file left


def test_a_folder_that_fails_to_build_leaves_nothing_not_even_its_new_parents(tmp_path):
    target = tmp_path / "a" / "b" / "ckpt"

    def build(folder):
        (folder / "config.json").write_text("{}")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match=f"could not write {target}: No space left on device"):
        write_folder_atomically(build, target)
    assert list(tmp_path.iterdir()) == []


def test_a_folder_is_renamed_into_place_or_merged_into_one_with_files(tmp_path):
    target = tmp_path / "ckpt"
    write_folder_atomically(lambda f: (f / "a.json").write_text("1"), target)
    assert sorted(p.name for p in target.iterdir()) == ["a.json"]
    (target / "keep.txt").write_text("user")
    victim = tmp_path / "victim.json"
    victim.write_text("precious")
    (target / "b.json").symlink_to(victim)
    write_folder_atomically(lambda f: [(f / n).write_text("2") for n in ("a.json", "b.json")], target)
    assert sorted(p.name for p in target.iterdir()) == ["a.json", "b.json", "keep.txt"]
    assert (target / "a.json").read_text() == "2" and not (target / "b.json").is_symlink()
    assert victim.read_text() == "precious" and sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "victim.json"]
