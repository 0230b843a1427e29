import json

from oled_hf.cli.main import main


def test_benchmark_reports_every_policy_next_to_full_residency(tiny_path, tmp_path, capsys):
    code = main(["benchmark", "--model", str(tiny_path), "--max-new-tokens", "16", "--block-length", "8",
                 "--cache-size", "8", "--system", "oled", "lru-full", "--runs", "2", "--warmup-runs", "0",
                 "--prompt", "hello", "--report-dir", str(tmp_path), "--json", "--loop-reference"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    names = [r["config"] for r in report["rows"]]
    assert names == ["full residency", "full residency (per-expert loop)", "oled @ cache size 8",
                     "lru-full @ cache size 8"]
    assert report["order"] == "round-robin" and report["rows"][1]["same_tokens"]
    for row in report["rows"][2:]:
        assert row["same_tokens"] and 0 <= row["hit_rate"] <= 1 and row["policy_ms_per_forward"] >= 0
        assert row["ratio_to_full"] > 0 and 0 <= row["cpu_share"] <= 1 and row["tpot_spread_ms"] >= 0
    assert (tmp_path / "report.json").is_file()


def test_benchmark_needs_a_budget(tiny_path, capsys):
    assert main(["benchmark", "--model", str(tiny_path)]) == 2
    assert "--cache-size" in capsys.readouterr().err
