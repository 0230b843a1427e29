"""Issue 67 item 17: a checkpoint write that is interrupted leaves nothing behind, and says so in one line.

Ctrl-C and SIGTERM unwind through the writer (its temporary folder is removed; SIGTERM used to end the process
with no cleanup); a process killed outright (SIGKILL, the OOM killer) cannot clean up, so the next write of the
same folder removes what it left (its PID is in the folder's name) and says so; a folder whose writer may still
run is named, never removed.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from oled_hf import fileio
from oled_hf.cli.main import main

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
# a streamed checkpoint big enough to be caught half-way (its MoE layer alone is ~100 MB in bf16)
SLOW = ["--preset", "mini", "--layers", "2", "--num-experts", "64", "--hidden-size", "1024"]


def hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def interruptible() -> None:
    """Ctrl-C reaches the child even where pytest itself runs in the background (``cmd &`` ignores SIGINT, and a
    Python started with SIGINT ignored keeps ignoring it, as a user's ``nohup`` asks)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for_a_temporary_folder(folder: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for entry in folder.glob(".out.*.tmp"):
            if any(entry.glob("*.safetensors")):
                return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError("make-tiny never started writing")


@pytest.mark.parametrize("sig, name", [(signal.SIGINT, "Ctrl-C"), (signal.SIGTERM, "SIGTERM")])
def test_an_interrupted_make_tiny_leaves_nothing_and_says_so_in_one_line(tmp_path, sig, name):
    proc = subprocess.Popen([sys.executable, "-m", "oled_hf.cli.main", "make-tiny", str(tmp_path / "out"), *SLOW],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=interruptible)
    wait_for_a_temporary_folder(tmp_path, proc)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (name, err)
    assert err.splitlines()[-1] == "oled-moe make-tiny: interrupted; files it was writing were removed", err
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_a_killed_writers_folder_is_removed_by_the_next_write(tmp_path, caplog):
    """SIGKILL: no cleanup can run; the next write of the folder finds the dead writer's folder and removes it."""
    code = ("import sys, time\nfrom pathlib import Path\nfrom oled_hf.fileio import write_folder_atomically\n"
            "def build(folder):\n    (folder / 'model.safetensors').write_bytes(b'x' * (1 << 20))\n"
            "    print('building', flush=True)\n    time.sleep(600)\n"
            "write_folder_atomically(build, Path(sys.argv[1]))\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "out")], env=ENV, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline() == "building\n"
    proc.kill()
    proc.wait(timeout=60)
    [left] = hidden(tmp_path)
    assert left.startswith(f".out.{proc.pid}@")
    with caplog.at_level(logging.WARNING, logger=fileio.__name__):
        assert main(["make-tiny", str(tmp_path / "out")]) == 0
    assert hidden(tmp_path) == [] and (tmp_path / "out" / "config.json").is_file()
    assert [r.getMessage() for r in caplog.records] == [
        f"removed {tmp_path / left} (1.0 MiB), left by an earlier write of {tmp_path / 'out'} whose process "
        f"(PID {proc.pid}) ended before it finished"]


def test_a_folder_whose_writer_may_still_run_is_named_not_removed(tmp_path, caplog):
    alive = tmp_path / f".out.{os.getppid()}@{fileio._writer_id().split('@')[1]}.abcdefgh.tmp"
    old = tmp_path / ".out.k2j4h5g6.tmp"  # named before writers put their PID in it
    other_host = tmp_path / ".out.1@elsewhere.abcdefg1.tmp"
    for folder in (alive, old, other_host):
        folder.mkdir()
    with caplog.at_level(logging.WARNING, logger=fileio.__name__):
        assert fileio.reclaim_leftovers(tmp_path / "out") == []
    assert sorted(hidden(tmp_path)) == sorted(p.name for p in (alive, old, other_host))
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3 and all("remove it: rm -r" in m for m in messages)
    assert any(f"process {os.getppid()} on" in m for m in messages) and any("an earlier write" in m for m in messages)
    assert not fileio._leftover_folders(tmp_path / "other")  # another target's folders are not this one's
