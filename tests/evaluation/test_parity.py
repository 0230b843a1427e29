"""Offload parity on a subset of the toy held-out split: 2 policies x 2 cache budgets, 16 problems."""

import importlib.util
from pathlib import Path

from oled_hf.evaluation.parity import format_table, run_parity

ROOT = Path(__file__).resolve().parents[2]


def test_offloading_changes_no_answer(tiny_path):
    reference, rows = run_parity(str(tiny_path), policies=("oled", "lru"),
                                 budgets=(("cache_ratio", 0.4), ("cache_size", 1)), limit=16, batch_size=16)
    assert len(reference.answers) == 16 and len(rows) == 4
    for row in rows:
        assert row.identical, format_table(reference, rows)
        assert row.accuracy == reference.accuracy
        assert 0.0 <= row.hit_rate <= 1.0
    table = format_table(reference, rows)
    assert "answers identical" in table and "1 slot(s)/layer" in table


def test_parity_script_runs(tiny_path, capsys):
    spec = importlib.util.spec_from_file_location("parity_script", ROOT / "eval" / "parity.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    code = script.main(["--model", str(tiny_path), "--limit", "4", "--policies", "tide", "--batch-size", "4"])
    out = capsys.readouterr().out
    assert code == 0 and "parity: every answer identical" in out and "tide" in out
