"""``write_model_code``: each code file written whole or not at all, a link at a target never written through."""

import errno

import pytest
from oled_hf.modeling import auto_map
from oled_hf.modeling.auto_map import CODE_FILES, write_model_code


def test_a_failed_copy_keeps_the_old_file_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    (tmp_path / "auto_map.py").write_text("old")
    real = auto_map.shutil.copyfileobj

    def full_disk(src, dst, *a, **k):
        dst.write(src.read(100))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(auto_map.shutil, "copyfileobj", full_disk)
    with pytest.raises(OSError, match=f"could not write {tmp_path / CODE_FILES[0]}: No space left on device"):
        write_model_code(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["auto_map.py"] and (tmp_path / "auto_map.py").read_text() == "old"
    monkeypatch.setattr(auto_map.shutil, "copyfileobj", real)
    write_model_code(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(CODE_FILES)
    assert (tmp_path / "auto_map.py").read_bytes() == open(auto_map.__file__, "rb").read()
    assert (tmp_path / "auto_map.py").stat().st_mode & 0o777 == 0o644


def test_a_link_at_a_code_file_is_replaced_not_written_through(tmp_path):
    victim = tmp_path / "victim.py"
    victim.write_text("another checkpoint's file")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "cache.py").symlink_to(victim)
    write_model_code(tmp_path / "ckpt")
    assert victim.read_text() == "another checkpoint's file" and not (tmp_path / "ckpt" / "cache.py").is_symlink()
