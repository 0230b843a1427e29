"""``trace record --out``: refused before any work unless it can be written as asked; written whole (issue 35).

Item 1: an existing file or link is refused without ``--overwrite`` (the trace used to replace it,
through the link too), and ``--overwrite`` replaces the link itself. Item 3: counts are checked
before the model loads. Item 4: a read-only folder is refused before decoding, and a failed final
write is one line that leaves nothing behind.
"""

from __future__ import annotations

import errno

import pytest

from oled_hf.cli import trace as trace_cli
from oled_hf.cli.main import main
from oled_hf.offload import trace as trace_module
from oled_hf.offload.trace import load_trace
from tests.read_only import read_only


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("hello there\n")
    return path


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if the command gets as far as resolving (then loading) the model."""
    def resolve(*args, **kwargs):
        raise AssertionError("the model was loaded before --out was checked")

    monkeypatch.setattr(trace_cli, "resolve_model", resolve)


def record(model, prompts, out, *extra) -> list[str]:
    return ["trace", "record", "--model", str(model), "--prompts", str(prompts), "--out", str(out), "--limit", "1",
            "--max-new-tokens", "8", "--block-length", "8", "--quiet", *extra]


def one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    prefix = "oled-moe trace record: error: "
    assert captured.err.startswith(prefix) and captured.err.count("\n") == 1, captured.err
    return captured.err[len(prefix):-1]


def test_an_existing_file_is_refused_before_recording(tmp_path, prompts, capsys, no_model):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    assert main(record("unused", prompts, victim)) == 2
    assert one_line_error(capsys) == (f"--out {victim} already exists; pass --overwrite to replace it, or choose a "
                                      "new path")
    assert victim.read_text() == "precious\n"


def test_a_link_is_refused_too(tmp_path, prompts, capsys, no_model):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    link = tmp_path / "link.trace"
    link.symlink_to(victim)
    assert main(record("unused", prompts, link)) == 2
    assert "already exists; pass --overwrite" in one_line_error(capsys)
    dangling = tmp_path / "dangling.trace"
    dangling.symlink_to(tmp_path / "nowhere")
    assert main(record("unused", prompts, dangling)) == 2
    assert "already exists; pass --overwrite" in one_line_error(capsys)
    assert victim.read_text() == "precious\n" and link.is_symlink() and not (tmp_path / "nowhere").exists()


def test_overwrite_replaces_the_link_itself_not_its_target(tiny_path, tmp_path, prompts, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    link = tmp_path / "link.trace"
    link.symlink_to(victim)
    assert main(record(tiny_path, prompts, link, "--overwrite")) == 0
    assert "recorded 1 prompts" in capsys.readouterr().out
    assert victim.read_text() == "precious\n"
    assert not link.is_symlink() and load_trace(link).num_forwards > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.trace", "p.txt", "victim.txt"]


def test_a_read_only_folder_is_refused_before_any_decoding(tmp_path, prompts, capsys, no_model):
    """Before: every prompt was decoded, then the write failed."""
    out = tmp_path / "ro" / "t.trace"
    with read_only(out.parent):
        assert main(record("unused", prompts, out)) == 2
    error = one_line_error(capsys)
    assert error.startswith(f"--out {out}: its folder {str(out.parent)!r} is not writable (")
    assert not out.exists()


@pytest.mark.parametrize("flag, value, message", [
    ("--threads", "0", "--threads 0 is invalid: must be between 1 and this machine's"),
    ("--threads", "1000000", "--threads 1000000 is invalid: must be between 1 and this machine's"),
    ("--limit", "0", "--limit 0 is invalid: must be >= 1 (omit it to use every prompt)"),
    ("--limit", "-1", "--limit -1 is invalid: must be >= 1"),
    ("--batch-size", "0", "--batch-size 0 is invalid: must be >= 1"),
])
def test_counts_are_checked_before_the_model_loads(tmp_path, prompts, capsys, no_model, flag, value, message):
    """Before: --threads 0 was ignored, --threads 1000000 a MemoryError traceback, --limit 0 an empty trace."""
    argv = record("unused", prompts, tmp_path / "t.trace")
    argv[argv.index("--limit"):argv.index("--limit") + 2] = []
    assert main([*argv, flag, value]) == 2
    assert one_line_error(capsys).startswith(message)
    assert not (tmp_path / "t.trace").exists()


def test_a_failed_final_write_is_one_line_and_leaves_nothing(tiny_path, tmp_path, prompts, capsys, monkeypatch):
    """A full disk at the end: one line naming --out and the OS error; no partial or temporary file."""
    def full_disk(obj, f, *args, **kwargs):
        with (open(f, "wb") if isinstance(f, str) else f) as fh:
            fh.write(b"PK\x03\x04 half a trace")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(trace_module.torch, "save", full_disk)
    out = tmp_path / "t.trace"
    assert main(record(tiny_path, prompts, out)) == 2
    assert one_line_error(capsys) == (f"[Errno 28] could not write {out}: No space left on device; nothing was "
                                      "written there")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.txt"]


@pytest.mark.parametrize("line, message", [
    ('{"prompt": 5}', "prompt=5 is invalid: must be a non-empty string"),
    ('{"prompt": "", "question": "a fallback"}', "prompt='' is invalid: must be a non-empty string"),
    ('{"prompt": "unclosed', "not a JSON object (Unterminated string"),
    ('{"answer": "4"}', "JSON line without 'prompt', 'question' or 'text'"),
])
def test_a_bad_jsonl_prompt_names_its_line(tmp_path, line, message):
    """Before: 5 reached the tokenizer (a traceback), "" silently became the question, bad JSON named no file."""
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(ValueError) as err:
        trace_cli.read_prompts(str(path))
    assert str(err.value).startswith(f"{path}:2: {message}"), str(err.value)
    path.write_text('{"question": "q"}\n\nplain text\n')
    assert trace_cli.read_prompts(str(path)) == ["q", "plain text"]
