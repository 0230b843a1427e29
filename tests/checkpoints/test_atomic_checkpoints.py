"""Checkpoint writers fail whole: a write that fails half-way leaves no file of it (issue 35 item 4).

``make-tiny``, ``prepare`` and ``write_random_checkpoint`` build in a temporary sibling folder and
rename it into place. Each case makes a writer fail after it wrote some files (a full disk, by a
patched writer, or ``ulimit -f`` in a subprocess) and checks that the output folder is as it was
(missing, or byte for byte the old checkpoint), no temporary folder is left, and the CLI says so
in one line naming the folder and the OS error.
"""

from __future__ import annotations

import errno
import resource
import shutil
from pathlib import Path

import pytest

from oled_hf.checkpoints import factory, prepare, streaming
from oled_hf.checkpoints.factory import make_checkpoint, make_config
from oled_hf.checkpoints.prepare import prepare_checkpoint
from oled_hf.checkpoints.streaming import write_random_checkpoint
from oled_hf.cli.main import main
from oled_hf.toy import TOY_CHECKPOINT
from tests.checkpoints.test_checkpoint_safety import snapshot
from tests.read_only import read_only

ENOSPC = OSError(errno.ENOSPC, "No space left on device")


def fail_after_writing(name: str):
    """A writer that writes a file ``name`` into the folder it was given, then finds the disk full."""
    def writer(folder, *args, **kwargs):
        (Path(folder) / name).write_text("half")
        raise ENOSPC

    return writer


def only(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def one_line_error(capsys, command: str) -> str:
    captured = capsys.readouterr()
    prefix = f"oled-moe {command}: error: "
    assert captured.err.startswith(prefix) and captured.err.count("\n") == 1, captured.err
    return captured.err[len(prefix):-1]


def test_make_tiny_that_fails_half_way_leaves_no_folder(tmp_path, capsys, monkeypatch):
    """Before: config.json, generation_config.json and the shards stayed behind."""
    monkeypatch.setattr(factory, "build_tokenizer", fail_after_writing("tokenizer.json"))
    out = tmp_path / "new" / "tiny"
    assert main(["make-tiny", str(out)]) == 2
    assert one_line_error(capsys, "make-tiny") == (f"[Errno 28] could not write {out}: No space left on device; "
                                                   "nothing was written there")
    assert only(tmp_path) == []  # neither the folder, its temporary sibling, nor the parent it created


def test_make_tiny_overwrite_that_fails_leaves_the_old_checkpoint(tmp_path, monkeypatch):
    out = Path(shutil.copytree(TOY_CHECKPOINT, tmp_path / "ckpt"))
    before = snapshot(out)
    monkeypatch.setattr(factory, "build_tokenizer", fail_after_writing("tokenizer.json"))
    with pytest.raises(OSError, match="could not write .*ckpt: No space left on device"):
        make_checkpoint(out, overwrite=True)
    assert snapshot(out) == before and only(tmp_path) == ["ckpt"]


def test_make_tiny_succeeds_into_an_empty_folder_readable_by_all(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    make_checkpoint(out)
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    assert out.stat().st_mode & 0o777 == 0o755  # not the temporary folder's 0700
    assert only(tmp_path) == ["empty"]


def test_make_tiny_under_ulimit_f_leaves_nothing(tmp_path, capsys):
    """A real failed write: 1 MiB of file size allowed (the soft limit, restored after), 4 MB shards."""
    out = tmp_path / "sub" / "tiny"
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))  # Python ignores SIGXFSZ: writes fail with EFBIG
    try:
        code = main(["make-tiny", str(out)])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert code == 2
    assert one_line_error(capsys, "make-tiny") == (f"[Errno {errno.EFBIG}] could not write {out}: File too large; "
                                                   "nothing was written there")
    assert only(tmp_path) == []


def test_make_tiny_into_a_read_only_folder_is_one_line(tmp_path, capsys):
    with read_only(tmp_path / "ro") as ro:
        assert main(["make-tiny", str(ro / "tiny")]) == 2
        error = one_line_error(capsys, "make-tiny")
    assert error.startswith(f"OUT={str(ro / 'tiny')!r}: its folder {str(ro)!r} is not writable (")
    assert only(ro) == []


def test_a_streamed_checkpoint_into_a_read_only_mount_says_read_only_not_0_gib_free(tmp_path, capsys, monkeypatch):
    """Issue 67 item 19: a read-only mount reports 0 bytes free; make-tiny said "needs 0.0 GiB ... 0.0 GiB free"."""
    import shutil as shutil_module
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil_module, "disk_usage", lambda path: usage(1 << 40, 1 << 40, 0))  # as a ro mount says
    with read_only(tmp_path / "ro") as ro:
        assert main(["make-tiny", str(ro / "mini"), "--preset", "mini", "--layers", "1", "--quiet"]) == 2
        error = one_line_error(capsys, "make-tiny")
    assert error.startswith(f"OUT={str(ro / 'mini')!r}: its folder {str(ro)!r} is not writable (")
    assert "free" not in error


@pytest.fixture
def src(tmp_path) -> Path:
    return Path(shutil.copytree(TOY_CHECKPOINT, tmp_path / "x"))


def test_prepare_that_fails_half_way_leaves_no_folder(src, tmp_path, capsys, monkeypatch):
    before = snapshot(src)
    monkeypatch.setattr(prepare, "_write_generation_config",
                        lambda src_, folder, *a: fail_after_writing("generation_config.json")(folder))
    out = tmp_path / "p"
    assert main(["prepare", str(src), str(out)]) == 2
    assert one_line_error(capsys, "prepare") == (f"[Errno 28] could not write {out}: No space left on device; "
                                                 "nothing was written there")
    assert only(tmp_path) == ["x"] and snapshot(src) == before


def test_prepare_overwrite_that_fails_leaves_the_prepared_folder(src, tmp_path, monkeypatch):
    out = tmp_path / "p"
    prepare_checkpoint(src, out)
    prepared = snapshot(out)
    monkeypatch.setattr(prepare, "write_model_code", fail_after_writing("auto_map.py"))
    with pytest.raises(OSError, match="No space left on device"):
        prepare_checkpoint(src, out, overwrite=True)
    assert snapshot(out) == prepared and only(tmp_path) == ["p", "x"]


def test_write_random_checkpoint_that_fails_leaves_no_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(streaming, "write_model_code", fail_after_writing("auto_map.py"))
    out = tmp_path / "big"
    with pytest.raises(OSError, match=f"could not write {out}: No space left on device"):
        write_random_checkpoint(out, make_config("tiny"))
    assert only(tmp_path) == []
