"""`oled-moe report`: every section and plot from traces, sweeps inferred from trace headers."""

import pytest

from oled_hf.sim.report import HEADLINE_PCT, SYSTEMS, run_systems, slots_for, targets
from oled_hf.sim.synthetic import synthetic_trace


def test_slots_for_percent():
    assert [slots_for(p, 256) for p in (10, 15, 25, 40, 100)] == [26, 38, 64, 102, 256]
    assert slots_for(1, 8) == 1


def test_report_writes_markdown_and_plots(tmp_path):
    pytest.importorskip("matplotlib")
    from oled_hf.cli.main import main

    paths = []
    for block, batch in ((8, 1), (16, 1), (8, 2)):
        t = synthetic_trace(num_layers=3, num_experts=16, top_k=2, block_length=block, num_blocks=2, batch=batch,
                            seed=block + batch)
        t.header["batch_size"] = batch
        path = tmp_path / f"syn-b{block}-bs{batch}.trace"
        t.save(str(path))
        paths.append(str(path))
    out = tmp_path / "rep"
    assert main(["report", *paths, "--out", str(out), "--sizes", "25", "100", "--planner-us", "10"]) == 0
    md = (out / "report.md").read_text()
    for heading in ("## Traces", "### Headline", "## (c) Ablation", "## (d) Block length", "## (e) Batch size",
                    "## (f) PCIe", "## (g) Planner", "Belady MIN bounds demand/bypass caching only"):
        assert heading in md, heading
    for name in ("prefetch", "moe-infinity", "+cooperative compensation", "16 GB/s", "block=16", "batch=2"):
        assert name in md, name
    pngs = {p.name for p in out.glob("*.png")}
    assert {"a_tpot_util_syn-b8-bs1.png", "b_gap_syn-b8-bs1.png", "c_ablation.png", "g_overhead.png",
            "d_syn.png", "e_syn.png"} <= pngs


def test_targets_name_met_and_missed():
    t = synthetic_trace(num_layers=3, num_experts=16, top_k=2, block_length=8, num_blocks=2, seed=0)
    from oled_hf.offload.costmodel import CostModel

    runs = run_systems(t, "x", SYSTEMS, HEADLINE_PCT, CostModel.h200_pcie5(2048, 512, kernel="grouped"), 0.0,
                       bounds=False)
    lines = targets(runs)
    assert len(lines) == 5 and all(("MET" in x) or ("MISSED" in x) for x in lines)
