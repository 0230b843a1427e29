"""The GPU check script, exercised on the CPU in a reduced form so that it cannot rot."""

import json

import pytest

from tests.eval_scripts import ROOT
from tests.eval_scripts import load_eval_script as _load


@pytest.mark.parametrize("cpu_compute", ["auto", "on"])  # on: the rows run as auto resolves beside CUDA
def test_gpu_check_reduced_on_cpu(tmp_path, capsys, cpu_compute):
    gpu_check = _load("gpu_check")
    code = gpu_check.main(["--preset", "tiny", "--device", "cpu", "--cache-sizes", "4", "13", "--max-new-tokens", "16",
                           "--block-length", "8", "--prompts", "1", "--out-dir", str(tmp_path),
                           "--cpu-compute", cpu_compute])
    out = capsys.readouterr().out
    assert code == 0, out
    specs = gpu_check.row_specs(gpu_check.parser().parse_args(["--cache-sizes", "4", "13",
                                                               "--cpu-compute", cpu_compute]))
    assert specs == [f"oled@4:{cpu_compute}", f"lru@4:{cpu_compute}", f"oled@13:{cpu_compute}",
                     f"lru@13:{cpu_compute}", "oled@4:off", "oled+previous@4:off", "all-cached"]
    rows = {spec: json.loads((tmp_path / gpu_check.result_name("row", spec)).read_text()) for spec in specs}
    assert all(r["ok"] and not r["failures"] for r in rows.values())
    assert all(r["token_agreement"] == 1.0 for r in rows.values())  # one device: bit-identical
    want = "on" if cpu_compute == "on" else "off"  # auto is off where the device is the CPU
    assert rows[f"oled@4:{cpu_compute}"]["cpu_compute"] == want
    assert (rows[f"oled@4:{cpu_compute}"]["cpu_expert_tokens"] > 0) == (want == "on")
    assert rows["oled+previous@4:off"]["prefetches"] > 0
    cached = rows["all-cached"]
    assert cached["routing_syncs_per_layer"] == 0 and cached["host_syncs_per_layer"] == 0 and cached["filled_bytes"]
    assert all(r["host_syncs_per_layer"] <= (2 if r["cpu_compute"] == "on" else 1) for r in rows.values())
    assert all(r["bandwidth"]["wave_gb_per_s"] > 0 for r in rows.values())
    resident = json.loads((tmp_path / "resident.json").read_text())
    assert resident["ok"] and resident["loop_agreement"] == 1.0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["ok"] and report["rows"] == len(specs)
    assert "gpu_check: every check passed" in out and "host syncs/layer" in out


def test_a_failed_check_and_a_missing_stage_fail_the_report_loudly(tmp_path, capsys, monkeypatch):
    """The all-cached row with CPU compute on (as the check once loaded it beside CUDA) leaves layers without every
    expert: its row fails, and a row whose stage never wrote its file fails the report too."""
    gpu_check = _load("gpu_check")
    common = ["--preset", "tiny", "--device", "cpu", "--cache-sizes", "4", "--policies", "lru", "--max-new-tokens", "8",
              "--block-length", "8", "--out-dir", str(tmp_path)]
    assert gpu_check.main(["build", *common]) == 0 and gpu_check.main(["resident", *common]) == 0
    parse, config = gpu_check.parse_row, gpu_check.OffloadConfig
    monkeypatch.setattr(gpu_check, "parse_row", lambda spec: ("oled", None, "on") if spec == "all-cached" else
                        parse(spec))
    # a link the dispatcher believes slow, as PCIe beside a GPU's compute: CPU compute takes part of the fill
    monkeypatch.setattr(gpu_check, "OffloadConfig", lambda **kw: config(**kw, h2d_bandwidth_gbps=0.001))
    assert gpu_check.main(["row", "--row", "all-cached", *common]) == 1
    row = json.loads((tmp_path / "row-all_cached.json").read_text())
    assert not row["ok"] and any("not every expert cached" in f for f in row["failures"])
    assert gpu_check.main(["report", *common]) == 1
    out = capsys.readouterr().out
    assert "FAILED: lru@4:auto: no result file (killed, crashed or not run)" in out
    assert "FAILED: all-cached: not every expert cached" in out and "check(s) FAILED" in out


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
    (tmp_path / "resident.json").write_text("mine")
    with pytest.raises(SystemExit) as exit_:
        gpu_check.main(["--preset", "tiny", "--device", "cpu", "--out-dir", str(tmp_path)])
    assert exit_.value.code == 2
    assert "already holds resident.json; pass --overwrite to replace it" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["resident.json"]
    assert (tmp_path / "resident.json").read_text() == "mine"


def test_gpu_check_failed_write_keeps_the_old_result(tiny_path, tmp_path, monkeypatch):
    import errno

    import pytest

    from oled_hf import fileio

    (tmp_path / "resident.json").write_text("old")

    def full_disk(path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileio, "_fsync", full_disk)
    with pytest.raises(OSError, match=f"could not write {tmp_path / 'resident.json'}: No space left on device"):
        _load("gpu_check").main(["resident", "--model", str(tiny_path), "--device", "cpu", "--max-new-tokens", "8",
                                 "--block-length", "8", "--out-dir", str(tmp_path), "--overwrite"])
    assert [p.name for p in tmp_path.iterdir()] == ["resident.json"]
    assert (tmp_path / "resident.json").read_text() == "old"
