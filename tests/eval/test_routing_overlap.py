"""eval/routing_overlap.py's outputs: checked before any work, the figure and JSON written whole or not at all."""

import errno
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from oled_hf import fileio

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("routing_overlap", ROOT / "eval" / "routing_overlap.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    """A small synthetic trace (no model): the writes are under test, not the statistics."""
    from oled_hf.offload.trace import TraceWriter

    writer = TraceWriter(num_moe_layers=2, num_experts=8, top_k=2, block_length=4)
    rng = np.random.default_rng(0)
    for block in range(2):
        for iteration in range(3):
            ids = [np.stack([rng.permutation(8)[:2] for _ in range(4)]) for _ in range(2)]
            writer.add_forward("denoise", block, iteration, ids, [np.full((4, 2), 0.5, np.float32)] * 2)
    path = tmp_path_factory.mktemp("trace") / "t.trace"
    writer.save(str(path))
    return path


def test_a_missing_folder_is_refused_before_any_work(trace_file, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        _script().main([str(trace_file), "--json", str(tmp_path / "no" / "r.json")])
    assert e.value.code == 2 and "does not exist; create it first" in capsys.readouterr().err


def test_a_failed_write_keeps_the_old_files(trace_file, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    (tmp_path / "r.json").write_text("old json")
    (tmp_path / "r.png").write_bytes(b"old figure")

    def full_disk(path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileio, "_fsync", full_disk)
    script = _script()
    with pytest.raises(OSError, match=f"could not write {tmp_path / 'r.json'}: No space left on device"):
        script.main([str(trace_file), "--json", str(tmp_path / "r.json"), "--overwrite"])
    with pytest.raises(OSError, match=f"could not write {tmp_path / 'r.png'}: No space left on device"):
        script.main([str(trace_file), "--plot", str(tmp_path / "r.png"), "--overwrite"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.png"]
    assert (tmp_path / "r.json").read_text() == "old json" and (tmp_path / "r.png").read_bytes() == b"old figure"
    monkeypatch.undo()
    assert script.main([str(trace_file), "--plot", str(tmp_path / "r.png"), "--overwrite"]) == 0
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
