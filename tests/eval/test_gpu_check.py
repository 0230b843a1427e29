"""The GPU check script, exercised on the CPU in a reduced form so that it cannot rot."""

import json

from tests.eval_scripts import ROOT
from tests.eval_scripts import load_eval_script as _load


def test_gpu_check_reduced_on_cpu(tmp_path, capsys):
    gpu_check = _load("gpu_check")
    code = gpu_check.main(["--preset", "tiny", "--device", "cpu", "--cache-sizes", "4", "13", "--gen-length", "16",
                           "--block-length", "8", "--prompts", "1", "--out-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [r["config"] for r in rows][:4] == ["full residency", "full residency, expert loop",
                                               "oled @ 4 slots, cpu auto", "lru @ 4 slots, cpu auto"]
    assert all(r["token_agreement"] == 1.0 for r in rows)  # one device: bit-identical, loop included
    assert all(r["host_us_per_layer"] > 0 for r in rows[2:])
    assert "resident grouped vs loop TPOT" in out
    assert "exact tokens with CPU compute off: yes" in out
    assert rows[-1]["config"] == "oled @ 32 slots, all cached" and rows[-1]["routing_syncs_per_layer"] == 0
    assert all(r["routing_syncs_per_layer"] == 1 for r in rows[2:-1])
    assert "every expert cached: no routing sync, no miss, exact tokens: yes" in out


def test_gpu_check_shell_script_refuses_without_cuda():
    import subprocess

    script = ROOT / "eval" / "gpu_check.sh"
    proc = subprocess.run(["bash", str(script), "--preset", "tiny"], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "no CUDA device" in proc.stderr


def test_streaming_writer_matches_model_layout(tmp_path):
    from oled_hf.modeling import OledLLaDA2ForDiffusionLM

    from oled_hf.checkpoints.factory import make_config
    from oled_hf.checkpoints.streaming import write_random_checkpoint

    path = write_random_checkpoint(tmp_path / "ck", make_config("tiny"), shard_bytes=2 << 20).path
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    model = OledLLaDA2ForDiffusionLM.from_pretrained(path)
    assert model.moe_blocks()[0].gate.expert_bias.dtype.is_floating_point


def test_gpu_check_refuses_an_existing_result_before_any_work(tmp_path, capsys):
    import pytest

    gpu_check = _load("gpu_check")
    gpu_check.write_random_checkpoint = lambda *a, **k: pytest.fail("nothing may be built")
    (tmp_path / "gpu_check.json").write_text("mine")
    with pytest.raises(SystemExit) as exit_:
        gpu_check.main(["--preset", "tiny", "--device", "cpu", "--out-dir", str(tmp_path)])
    assert exit_.value.code == 2
    assert "already holds gpu_check.json; pass --overwrite to replace it" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["gpu_check.json"]
    assert (tmp_path / "gpu_check.json").read_text() == "mine"


def test_gpu_check_failed_write_keeps_the_old_result(tiny_path, tmp_path, monkeypatch):
    import errno

    import pytest

    from oled_hf import fileio

    (tmp_path / "gpu_check.json").write_text("old")

    def full_disk(path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileio, "_fsync", full_disk)
    with pytest.raises(OSError, match=f"could not write {tmp_path / 'gpu_check.json'}: No space left on device"):
        _load("gpu_check").main(["--model", str(tiny_path), "--device", "cpu", "--cache-sizes", "4", "--policies",
                                 "lru", "--gen-length", "8", "--block-length", "8", "--out-dir", str(tmp_path),
                                 "--overwrite"])
    assert [p.name for p in tmp_path.iterdir()] == ["gpu_check.json"]
    assert (tmp_path / "gpu_check.json").read_text() == "old"
