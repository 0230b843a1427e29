"""Progress bars: on stderr when it is a terminal, silent in pipes and with --quiet."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

from oled_hf.progress import PipeProgress, duration, progress, rate

ROOT = Path(__file__).resolve().parents[1]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bar_only_on_a_terminal_and_not_when_quiet(monkeypatch):
    for stream, quiet, shown in ((Terminal(), False, True), (Terminal(), True, False), (io.StringIO(), False, False)):
        monkeypatch.setattr(sys, "stderr", stream)
        assert list(progress(range(3), desc="steps", quiet=quiet)) == [0, 1, 2]
        assert ("steps: 100%" in stream.getvalue() and "3/3" in stream.getvalue()) is shown, (quiet, shown)
        assert ("\r" in stream.getvalue()) is shown  # only a terminal gets a redrawn bar


class Clock:
    """A fake monotonic clock: ``advance`` moves it, nothing sleeps."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_pipe_gets_a_line_every_interval_and_the_duration(monkeypatch):
    pipe, clock = io.StringIO(), Clock()
    monkeypatch.setattr(sys, "stderr", pipe)
    bar = progress(total=6, desc="recording", unit="prompt", interval=10, clock=clock)
    assert isinstance(bar, PipeProgress)
    for _ in range(6):
        clock.now += 4  # one prompt every 4 s: a line at 12 s (>= 10 s apart), then the end's
        bar.update()
    bar.close()
    bar.close()  # a second close adds nothing
    assert pipe.getvalue().splitlines() == [
        "recording: 3/6 prompt, 12.0 s elapsed, 4.00 s/prompt, about 12.0 s left",
        "recording: done, 6/6 prompt in 24.0 s (4.00 s/prompt)",
    ]


def test_a_pipe_line_over_an_iterable_and_a_stopped_run(monkeypatch):
    pipe, clock = io.StringIO(), Clock()
    monkeypatch.setattr(sys, "stderr", pipe)

    def steps():
        for i in range(200):
            clock.now += 0.5
            yield i

    assert sum(progress(steps(), total=200, desc="training", unit="step", clock=clock)) == sum(range(200))
    lines = pipe.getvalue().splitlines()
    assert len(lines) == 10 and lines[0] == "training: 20/200 step, 10.0 s elapsed, 2.00 step/s, about 1m30s left"
    assert lines[-1] == "training: done, 200/200 step in 1m40s (2.00 step/s)"
    pipe.seek(0), pipe.truncate()
    bar = progress(total=10, desc="training", unit="step", clock=clock)
    bar.update(3)
    clock.now += 3725
    bar.close()  # stopped early (a time limit): says so, with the duration
    assert pipe.getvalue() == "training: stopped at 3/10 step in 1h02m (1241.67 s/step)\n"


def test_quiet_prints_nothing_in_a_pipe(monkeypatch):
    pipe, clock = io.StringIO(), Clock()
    monkeypatch.setattr(sys, "stderr", pipe)
    bar = progress(total=3, desc="benchmark", unit="pass", quiet=True, interval=0, clock=clock)
    for _ in range(3):
        clock.now += 20
        bar.update()
    bar.close()
    assert pipe.getvalue() == ""


def test_durations_and_rates_read_well():
    assert [duration(s) for s in (0.04, 59.94, 65, 3599, 7380)] == ["0.0 s", "59.9 s", "1m05s", "59m59s", "2h03m"]
    assert rate(30, 10, "step") == "3.00 step/s" and rate(2, 65, "prompt") == "32.50 s/prompt"
    assert rate(0, 10, "step") == "- step/s"


def _read_all(fd: int, sink: list[bytes]) -> None:
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the other end closed
            return
        if not chunk:
            return
        sink.append(chunk)


def test_trace_record_shows_a_bar_on_a_terminal(tiny_path, tmp_path):
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
    assert "recording 2 prompts: 100%" in terminal and "block/s" in terminal  # per diffusion block (issue 67)
    command[command.index("--out") + 1] = str(tmp_path / "quiet.trace")  # trace record never overwrites
    quiet = subprocess.run([*command, "--quiet"], capture_output=True, text=True, timeout=120, env=env)
    assert quiet.returncode == 0 and "recording" not in quiet.stderr


def test_trace_record_piped_ends_with_its_duration(tiny_path, tmp_path, capsys):
    """In a log, ``trace record`` says how long it took (before: nothing until the result line)."""
    from oled_hf.cli.main import main

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\ntell me a story\n")
    code = main(["trace", "record", "--model", str(tiny_path), "--prompts", str(prompts), "--out",
                 str(tmp_path / "t.trace"), "--max-new-tokens", "8", "--block-length", "8"])
    out, err = capsys.readouterr()
    assert code == 0 and out.startswith("recorded 2 prompts, ")
    assert re.search(r"^recording 2 prompts: done, (\d+)/\1 block in \d+\.\d s \(", err, re.M), err
    assert "\r" not in err


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


def test_library_bars_are_off_in_a_log_even_for_libraries_imported_later():
    """A command turns the libraries' bars off before importing them (importing transformers for that alone cost
    seconds of every start); the library reads the switch when it is imported, by the model load."""
    code = ("import io, os, sys\nsys.stderr = io.StringIO()\nfrom oled_hf.progress import quiet_library_bars\n"
            "quiet_library_bars()\nassert 'transformers' not in sys.modules and 'huggingface_hub' not in sys.modules\n"
            "from transformers.utils import logging\nassert not logging.is_progress_bar_enabled()\nprint('ok')\n")
    env = {k: v for k, v in os.environ.items() if "PROGRESS_BARS" not in k}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr
