"""Routing statistics of a recorded trace (eval/routing_overlap.py): bounds, pairing, the printed report, the plot."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from oled_hf.offload.trace import load_trace
from oled_hf.sim.routing_stats import routing_stats, state_labels, token_persistence

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trace(tiny_path, tmp_path_factory):
    from oled_hf.cli.main import main

    tmp = tmp_path_factory.mktemp("routing")
    prompts = tmp / "prompts.txt"
    prompts.write_text("hello\nwhat is 2+2\n")
    out = tmp / "t.trace"
    assert main(["trace", "record", "--model", str(tiny_path), "--prompts", str(prompts), "--out", str(out),
                 "--block-length", "8", "--max-new-tokens", "24"]) == 0
    return load_trace(str(out))


def test_token_persistence():
    prev = np.array([[[1, 2], [3, 4]]])
    nxt = np.array([[[2, 5], [3, 4]]])
    assert token_persistence(prev, nxt).tolist() == [[0.5, 1.0]]


def test_statistics_are_bounded_and_consistent(trace):
    stats = routing_stats(trace)
    s = stats.summary()
    k, b, e = s["top_k"], s["block_length"], s["num_experts"]
    assert s["steps"] == trace.num_events  # one denoising forward per iteration event (batch 1)
    assert s["blocks"] >= 2 and s["iterations_per_block"] >= 1
    for v in s["distinct_experts_per_iteration"]["per_layer"]:
        assert 1 <= v <= min(e, b * k)
    for key in ("overlap_within_block", "overlap_across_blocks"):
        assert s[key]["pairs"] > 0 and 0.0 <= s[key]["mean"] <= 1.0
    per_iter, per_block = s["activation_ratio_per_iteration"], s["activation_ratio_per_block"]
    assert all(a <= bl + 1e-9 for a, bl in zip(per_iter, per_block))  # a block's union covers each iteration
    assert set(s["persistence_by_state"]) == set(state_labels())
    assert sum(v["tokens"] for v in s["persistence_by_state"].values()) > 0
    assert all(0.0 <= v["mean"] <= 1.0 for v in s["persistence_by_state"].values() if v["tokens"])


def test_script_prints_and_plots(trace, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    spec = importlib.util.spec_from_file_location("routing_overlap", ROOT / "eval" / "routing_overlap.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    path = tmp_path / "t.trace"
    trace.save(str(path))
    assert script.main([str(path), "--plot", str(tmp_path / "r.png"), "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "distinct/iter" in out and "LLaDA2.0-mini (published)" in out and "route persistence" in out
    assert (tmp_path / "r.png").stat().st_size > 10_000
    legacy = script.overlap_stats(trace)
    assert legacy["within_block"][1] > 0 and legacy["num_experts"] == trace.num_experts


def _script():
    spec = importlib.util.spec_from_file_location("routing_overlap", ROOT / "eval" / "routing_overlap.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_layers_are_numbered_as_model_layers_and_stats_name_them(trace, tiny_path, tmp_path, capsys):
    """The recorder stores first_k_dense_replace; the figure's layers match /stats (decoder layers, 1-based)."""
    import json

    from oled_hf.serve.metrics import moe_layer_numbers

    config = json.loads((Path(tiny_path) / "config.json").read_text())
    assert trace.header["first_k_dense_replace"] == config["first_k_dense_replace"]
    label, numbers = _script().layer_numbering(trace)

    class Cfg:
        first_k_dense_replace = config["first_k_dense_replace"]
        num_hidden_layers = config["num_hidden_layers"]

    assert (label, numbers) == ("decoder layer", moe_layer_numbers(Cfg, trace.num_layers))
    path = tmp_path / "t.trace"
    trace.save(str(path))
    assert _script().main([str(path)]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line[:1].isdigit()]
    assert rows == [str(n) for n in numbers]


def test_existing_outputs_are_refused_before_any_work(trace, tmp_path, capsys):
    path = tmp_path / "t.trace"
    trace.save(str(path))
    mine = tmp_path / "mine.png"
    mine.write_bytes(b"a figure of mine")
    with pytest.raises(SystemExit) as e:
        _script().main([str(path), "--plot", str(mine)])
    assert e.value.code == 2 and mine.read_bytes() == b"a figure of mine"
    assert f"--plot {mine} exists; give a new path or pass --overwrite" in capsys.readouterr().err
    pytest.importorskip("matplotlib")
    assert _script().main([str(path), "--plot", str(mine), "--overwrite"]) == 0
    assert mine.read_bytes() != b"a figure of mine"
