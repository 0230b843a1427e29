"""Commands that write checkpoints never destroy one (issue 23 items 1 and 2).

Every case runs on a copy of the shipped toy checkpoint and compares every file's bytes (and every
link's target) before and after: a refused command exits 2 with one line on stderr and leaves both
folders exactly as they were.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from oled_hf.checkpoints.factory import make_checkpoint
from oled_hf.checkpoints.prepare import prepare_checkpoint
from oled_hf.checkpoints.streaming import write_random_checkpoint
from oled_hf.cli.main import main
from oled_hf.toy import TOY_CHECKPOINT


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every entry under ``folder``: a link by its target, a file by its bytes."""
    return {
        p.relative_to(folder).as_posix(): os.readlink(p) if p.is_symlink() else p.read_bytes()
        for p in sorted(folder.rglob("*")) if p.is_symlink() or p.is_file()
    }


@pytest.fixture
def src(tmp_path) -> Path:
    return Path(shutil.copytree(TOY_CHECKPOINT, tmp_path / "x"))


def refused(argv: list[str], capsys) -> str:
    """Run the CLI, expect exit 2, and return its single stderr line's message."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    prefix = f"oled-moe {argv[0]}: error: "
    assert captured.err.startswith(prefix) and captured.err.count("\n") == 1, captured.err
    assert captured.out == ""
    return captured.err[len(prefix):-1]


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
@pytest.mark.parametrize("where, message", [
    ("x", "is the same folder as SRC"),
    ("x/../x/", "is the same folder as SRC"),
    ("alias", "is the same folder as SRC"),
    ("x/sub", "is inside SRC"),
    (".", "is inside OUT"),
])
def test_prepare_refuses_out_at_or_around_src(src, tmp_path, capsys, where, message, overwrite):
    (tmp_path / "alias").symlink_to(src)
    before = snapshot(src)
    out = f"{tmp_path}/{where}"
    error = refused(["prepare", str(src), out, *overwrite], capsys)
    assert message in error and "give a new folder" in error
    assert snapshot(src) == before
    assert not (src / "sub").exists()
    with pytest.raises(ValueError, match=message):
        prepare_checkpoint(src, out, overwrite=bool(overwrite))
    assert snapshot(src) == before


def test_prepare_refuses_a_folder_with_files_unless_overwrite(src, tmp_path, capsys):
    before = snapshot(src)
    out = tmp_path / "p"
    assert main(["prepare", str(src), str(out)]) == 0
    capsys.readouterr()
    prepared = snapshot(out)
    error = refused(["prepare", str(src), str(out)], capsys)
    assert error == (f"OUT {out} already holds files (config.json, model-00001-of-00003.safetensors, "
                     f"model-00002-of-00003.safetensors and 19 more); writing a checkpoint there would replace "
                     f"or delete them: give a new or empty folder, or pass --overwrite (overwrite=True) to "
                     f"replace them")
    assert snapshot(out) == prepared
    with pytest.raises(ValueError, match="already holds files"):
        prepare_checkpoint(src, out)
    assert main(["prepare", str(src), str(out), "--overwrite"]) == 0
    assert snapshot(out) == prepared and snapshot(src) == before


def test_prepare_overwrite_replaces_links_and_never_writes_through_them(src, tmp_path):
    """OUT's entries that link to SRC's files (config included) are replaced as links: SRC is not written."""
    before = snapshot(src)
    out = tmp_path / "p"
    out.mkdir()
    for name in ("config.json", "generation_config.json", "auto_map.py", "model-00001-of-00003.safetensors",
                 "tokenizer.json"):
        (out / name).symlink_to(src / name)
    prepare_checkpoint(src, out, overwrite=True)
    assert snapshot(src) == before
    assert not (out / "config.json").is_symlink()
    assert json.loads((out / "config.json").read_text())["architectures"] == ["OledLLaDA2ForDiffusionLM"]
    assert not (out / "auto_map.py").is_symlink() and not (out / "generation_config.json").is_symlink()
    for shard in src.glob("*.safetensors"):
        assert (out / shard.name).is_symlink() and (out / shard.name).resolve() == shard


@pytest.mark.parametrize("name", ["model-00002-of-00003.safetensors", "config.json"])
def test_prepare_refuses_a_hard_link_of_a_source_file(src, tmp_path, capsys, name):
    before = snapshot(src)
    out = tmp_path / "p"
    out.mkdir()
    os.link(src / name, out / name)
    error = refused(["prepare", str(src), str(out), "--overwrite"], capsys)
    assert error == (f"OUT {out / name} is the same file as SRC's {name} (a hard link): prepare never replaces "
                     f"a source file; remove {out / name} or give another OUT")
    assert snapshot(src) == before and (src / name).stat().st_nlink == 2
    assert sorted(p.name for p in out.iterdir()) == [name]


def test_prepare_refuses_a_folder_where_it_writes_a_file(src, tmp_path, capsys):
    out = tmp_path / "p"
    (out / "tokenizer.json").mkdir(parents=True)
    error = refused(["prepare", str(src), str(out), "--overwrite"], capsys)
    assert error == f"OUT {out} has a folder tokenizer.json where prepare writes a file; move it or give another OUT"
    assert [p.name for p in out.iterdir()] == ["tokenizer.json"]


def test_make_tiny_refuses_a_checkpoint_folder(src, tmp_path, capsys):
    before = snapshot(src)
    error = refused(["make-tiny", str(src)], capsys)
    assert error.startswith(f"OUT {src} already holds files (config.json, model-00001-of-00003.safetensors, ")
    assert "pass --overwrite (overwrite=True)" in error
    with pytest.raises(ValueError, match="already holds files"):
        make_checkpoint(src)
    from oled_hf.checkpoints.factory import make_config

    with pytest.raises(ValueError, match="already holds files"):
        write_random_checkpoint(src, make_config("tiny"))
    assert snapshot(src) == before
    error = refused(["make-tiny", str(src / "config.json")], capsys)
    assert error == f"OUT {src / 'config.json'} is a file, not a folder: give a new or empty folder"
    assert snapshot(src) == before


def test_make_tiny_checks_its_arguments_before_creating_the_folder(tmp_path):
    with pytest.raises(ValueError, match="preset='huge' is unknown"):
        make_checkpoint(tmp_path / "new", preset="huge")
    with pytest.raises(ValueError, match="dtype='float8' is not allowed; allowed: float32, bfloat16, float16"):
        make_checkpoint(tmp_path / "new", dtype="float8")
    with pytest.raises(ValueError, match="family='llada3' is unknown"):
        make_checkpoint(tmp_path / "new", family="llada3")
    assert not (tmp_path / "new").exists()


def test_make_tiny_overwrite_replaces_a_prepared_folder_and_keeps_what_it_linked(src, tmp_path, capsys):
    """With --overwrite the folder is rewritten as before, but its links to another checkpoint are only unlinked."""
    before = snapshot(src)
    out = tmp_path / "p"
    prepare_checkpoint(src, out)
    os.link(src / "tokenizer_config.json", out / "extra.json")  # a hard link a writer could write through
    assert main(["make-tiny", str(out), "--overwrite"]) == 0
    assert "wrote tiny checkpoint" in capsys.readouterr().out
    assert snapshot(src) == before
    assert not any(p.is_symlink() for p in out.iterdir())
    assert not (out / "extra.json").exists()
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == sorted(p.name for p in out.glob("*.safetensors"))
