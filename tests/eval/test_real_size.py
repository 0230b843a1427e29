"""eval/real_size.py on the tiny checkpoint: the same rows as at real size, in seconds."""

import json

from tests.eval_scripts import load_eval_script as _load


def test_real_size_rows_on_tiny(tiny_path, tmp_path, capsys):
    real_size = _load("real_size")
    out = tmp_path / "real.md"
    args = ["--dir", str(tiny_path), "--out", str(out), "--resident", "--ratios", "0.5", "--systems", "oled",
            "hybrimoe", "--store", "pinned", "--new-tokens", "8", "--block-length", "8", "--threads", "1"]
    assert real_size.main(args) == 0
    rows = json.loads(out.with_suffix(".json").read_text())
    assert [r["system"] for r in rows] == ["resident", "oled", "hybrimoe"]
    assert all("error" not in r for r in rows), rows
    assert rows[1]["tokens"] == rows[0]["tokens"] == rows[2]["tokens"]  # lossless, HybriMoE's live parts included
    assert rows[1]["store"] == "pinned" and rows[1]["store_gib"] > 0 and rows[1]["held_gib"] > rows[1]["store_gib"]
    assert "| oled | 0.5 | pinned |" in out.read_text()
    capsys.readouterr()
    assert real_size.main(args) == 2  # never replaces a user's file without --overwrite
    assert "pass --overwrite" in capsys.readouterr().err
