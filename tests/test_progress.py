"""Progress bars: on stderr when it is a terminal, silent in pipes and with --quiet."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

from oled_hf.progress import progress

ROOT = Path(__file__).resolve().parents[1]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bar_only_on_a_terminal_and_not_when_quiet(monkeypatch):
    for stream, quiet, shown in ((Terminal(), False, True), (Terminal(), True, False), (io.StringIO(), False, False)):
        monkeypatch.setattr(sys, "stderr", stream)
        assert list(progress(range(3), desc="steps", quiet=quiet)) == [0, 1, 2]
        assert ("steps: 100%" in stream.getvalue() and "3/3" in stream.getvalue()) is shown, (quiet, shown)


def _read_all(fd: int, sink: list[bytes]) -> None:
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the other end closed
            return
        if not chunk:
            return
        sink.append(chunk)


def test_trace_record_shows_a_bar_per_prompt_on_a_terminal(tiny_path, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\ntell me a story\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "oled_hf.cli.main", "trace", "record", "--model", str(tiny_path), "--prompts",
               str(prompts), "--out", str(tmp_path / "t.trace"), "--max-new-tokens", "8", "--block-length", "8"]
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # tqdm draws nothing at 0 columns
    chunks: list[bytes] = []
    reader = threading.Thread(target=_read_all, args=(master, chunks), daemon=True)
    reader.start()
    proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=slave, text=True, timeout=120, env=env)
    os.close(slave)
    reader.join(timeout=10)
    os.close(master)
    terminal = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0, terminal
    assert proc.stdout.startswith("recorded 2 prompts, ")  # the result stays on stdout, alone
    assert "recording: 100%" in terminal and "2/2" in terminal and "prompt/s" in terminal
    piped = subprocess.run([*command, "--quiet"], capture_output=True, text=True, timeout=120, env=env)
    assert piped.returncode == 0 and "recording" not in piped.stderr


def test_bench_generate_keeps_its_checkpoint_out_of_the_repository(monkeypatch, tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_generate", ROOT / "eval" / "bench_generate.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert bench.cache_dir() == tmp_path / "oled-hf"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert bench.cache_dir() == Path.home() / ".cache" / "oled-hf"
    assert ROOT not in bench.cache_dir().parents


def test_library_bars_go_only_by_the_same_rule(monkeypatch):
    from transformers.utils import logging

    from oled_hf.progress import quiet_library_bars

    was = logging.is_progress_bar_enabled()
    try:
        for stream, quiet, shown in ((Terminal(), False, True), (Terminal(), True, False),
                                     (io.StringIO(), False, False)):
            logging.enable_progress_bar()
            monkeypatch.setattr(sys, "stderr", stream)
            quiet_library_bars(quiet)
            assert logging.is_progress_bar_enabled() is shown, (quiet, shown)
    finally:
        (logging.enable_progress_bar if was else logging.disable_progress_bar)()


def test_no_loading_weights_bar_in_a_piped_log(tiny_path, tmp_path, capsys):
    """transformers draws "Loading weights" on any stderr; the CLI turns it off when that is not a terminal."""
    from transformers.utils import logging

    from oled_hf.cli.main import main

    was = logging.is_progress_bar_enabled()
    logging.enable_progress_bar()  # as in a fresh process
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\n")
    try:
        code = main(["trace", "record", "--model", str(tiny_path), "--prompts", str(prompts), "--out",
                     str(tmp_path / "t.trace"), "--max-new-tokens", "8", "--block-length", "8"])
    finally:
        (logging.enable_progress_bar if was else logging.disable_progress_bar)()
    err = capsys.readouterr().err
    assert code == 0, err
    assert "Loading weights" not in err and "it/s]" not in err, err


def test_load_memory_keeps_its_checkpoint_out_of_the_repository(monkeypatch, tmp_path, capsys):
    import importlib.util

    import pytest

    spec = importlib.util.spec_from_file_location("load_memory", ROOT / "eval" / "load_memory.py")
    load_memory = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(load_memory)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert load_memory.default_model() == tmp_path / "oled-hf" / "small"  # shared with make bench
    assert ROOT not in load_memory.default_model().parents
    with pytest.raises(SystemExit) as exit_:
        load_memory.main(["--model", str(tmp_path)])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.endswith(f"error: --model {tmp_path}: no *.safetensors files in that folder\n")
