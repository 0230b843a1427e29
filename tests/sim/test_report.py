"""`oled-moe report`: every section and plot from traces, sweeps inferred from trace headers."""

import re

import pytest

from oled_hf.sim.report import HEADLINE_PCT, SYSTEMS, run_systems, slots_for, targets
from oled_hf.sim.synthetic import synthetic_trace


def test_slots_for_percent():
    assert [slots_for(p, 256) for p in (10, 15, 25, 40, 100)] == [26, 38, 64, 102, 256]
    assert slots_for(1, 8) == 1


def test_report_writes_markdown_and_plots(tmp_path, capsys):
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
    dev = tmp_path / "dev.trace"
    synthetic_trace(num_layers=3, num_experts=16, top_k=2, block_length=8, num_blocks=2, seed=9).save(str(dev))
    assert main(["report", *paths, "--dev", str(dev), "--out", str(out), "--sizes", "25", "100",
                 "--planner-us", "10", "--bracket-window", "4"]) == 0
    assert re.search(r"^report: done, 4/4 trace in ", capsys.readouterr().err, re.M)  # a log hears the duration
    md = (out / "report.md").read_text()
    for heading in ("## Traces", "### Headline", "## (c) Ablation", "## (d) Block length", "## (e) Batch size",
                    "## (f) PCIe", "## (g) Planner", "## (h) Mis-calibration", "3 MoE layers x 16 experts",
                    "x bound (LP)", "| LP bound (valid) |", "| MIN bound (CPU-served misses enter free, loose) |",
                    "strongest fair system", "Target (2x errors)", "### Calibrated beliefs",
                    "Target: oled calibrated <= 1.05 x oled true", "### 25%: believed vs calibrated vs true",
                    "| oled / strongest fair (calibrated) |",
                    "## (i) Oracle ladder", "# OLED-MoE evaluation on synthetic traces", "| synthetic | 8 | 1 |",
                    "### syn-b16-bs1 (3 MoE layers x 16)", "Pure caching (`copy+uniform`)",
                    "## (j) The optimum bracketed, and where oled's time above the bound goes (40%)",
                    "| **valid bound (the larger)** | ", "| valid LP bound, windows of 4 forwards |",
                    "| valid dual bound, whole trace (2000 ascent steps) |",
                    "| **best offline schedule** |", "| belady, pure caching (offline) |",
                    "| retention (misses vs an offline schedule) |", "| remaining: oracle run -> bound |"):
        assert heading in md, heading
    for name in ("mixtral-offloading", "ktransformers", "moe-infinity+cpu", "lru-full", "lfu-full",
                 "+ confidence retention", "+ reuse-aware compensation", "16 GB/s", "block=16", "batch=2",
                 "CPU x0.25", "PCIe x4", "interval=1: ", "| lru-full | lru | none | cpu+reuse | adaptive |"):
        assert name in md, name
    pngs = {p.name for p in out.glob("*.png")}
    assert {"a_tpot_util_syn-b8-bs1.png", "b_gap_syn-b8-bs1.png", "c_ablation.png", "g_overhead.png",
            "d_syn.png", "e_syn.png", "i_ladder.png"} <= pngs
    ladder = md[md.index("## (i) Oracle ladder"):md.index("## (j) The optimum bracketed")]
    assert "### syn-b8-bs2" not in ladder  # batch-1 traces only
    for rung in ("| belady |", "| foresight-16 |", "| foresight-2 |", "| next-oracle |", "| previous-set |",
                 "| phase |", "| lru |", "| lfu |", "| score |", "| oled |", "| learned |"):
        assert ladder.count(rung) == 4, rung  # two traces x two dispatches
    for rung in ("| belady-reuse |", "| lru-reuse |"):
        assert ladder.count(rung) == 2, rung  # admission only: the fair dispatch's tables
    assert "exact reuse for admission adds" in ladder and "best online rung" in ladder
    assert "foresight of 2 accesses covers" in ladder
    assert "/ 1.000x |" in ladder  # lru's gain over itself
    j = md[md.index("## (j) The optimum bracketed"):]
    low, high = map(float, re.search(r"the optimum lies in \[([0-9.]+), ([0-9.]+)\]x fused", j).groups())
    assert low <= high  # the valid LP bound below the best offline schedule
    h = md[md.index("## (h) Mis-calibration"):md.index("## (i) Oracle ladder")]
    checks = re.findall(r"^- (CPU|PCIe) x[0-9.]+, \d+%: oled calibrated / true = [0-9.]+ .* -> (MET|MISSED)$", h, re.M)
    assert len(checks) == 8 * len(HEADLINE_PCT)  # every wrong belief at every headline size
    cal = h[h.index("### 25%: believed vs calibrated vs true"):]
    assert re.search(r"^\| oled \| [0-9.]+ \| [0-9.]+ / [0-9.]+ \|", cal, re.M)
    assert re.search(r"^\| mixtral-offloading \| [0-9.]+ \| 1\.000 / 1\.000 \|", cal, re.M)  # copy-only


def test_targets_name_met_and_missed():
    t = synthetic_trace(num_layers=3, num_experts=16, top_k=2, block_length=8, num_blocks=2, seed=0)
    from oled_hf.offload.costmodel import CostModel

    runs = run_systems(t, "x", SYSTEMS, HEADLINE_PCT, CostModel.h200_pcie5(2048, 512, kernel="grouped"), 0.0,
                       bounds=False)
    lines = targets(runs)
    assert len(lines) == 3 and all(x.count("MET") + x.count("MISSED") == 2 for x in lines)
    assert all("over the strongest composition" in x and "target 1.10x" in x and "target 1.25x" in x for x in lines)


def test_targets_are_issue_36s_margins():
    """1.10x over every composition, 1.25x over every published system, at most 1.25x the bound at 40%."""
    from types import SimpleNamespace

    from oled_hf.sim.report import Run

    def run(system, pct, tpot, bound=None):
        return Run("x", system, pct, SimpleNamespace(tpot_s=tpot, ratio_to_full=tpot), bound_ratio=bound)

    runs = [run("oled", 40, 1.0, bound=0.9), run("lru-full", 40, 1.2), run("lfu-full", 40, 1.3),
            run("hybrimoe", 40, 1.2), run("tide", 40, 1.5), run("oled", 15, 1.0), run("lru-full", 15, 1.05),
            run("hybrimoe", 15, 1.3)]
    lines = targets(runs)
    assert lines[0] == ("- 15%: oled 1.050x over the strongest composition (lru-full; target 1.10x): MISSED by 1.048x; "
                        "1.300x over the strongest published system (hybrimoe; target 1.25x): MET")
    assert lines[1] == ("- 40%: oled 1.200x over the strongest composition (lru-full; target 1.10x): MET; 1.200x over "
                        "the strongest published system (hybrimoe; target 1.25x): MISSED by 1.042x; 1.11x the valid "
                        "LP bound (target at most 1.25x): MET")


def test_every_system_gets_the_same_tuning_budget():
    from oled_hf.sim.report import TUNING_BUDGET, ReportSystem

    assert all(1 <= len(s.grid) <= TUNING_BUDGET for s in SYSTEMS)
    with pytest.raises(ValueError, match="searches 5 settings; the budget is 1..4"):
        ReportSystem("x", "lru", "", [{}] * 5)


def test_report_refuses_to_replace_an_existing_report(tmp_path, capsys):
    from oled_hf.cli.main import main

    t = synthetic_trace(num_layers=2, num_experts=8, top_k=2, block_length=8, num_blocks=1, seed=0)
    path = tmp_path / "t.trace"
    t.save(str(path))
    out = tmp_path / "rep"
    out.mkdir()
    (out / "report.md").write_text("mine")
    assert main(["report", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "report.md exists; pass --overwrite to replace it" in err[0]
    assert (out / "report.md").read_text() == "mine" and not list(out.glob("*.png"))  # nothing done


def test_trace_record_refuses_bad_out_before_any_work(tmp_path, capsys, monkeypatch):
    from oled_hf.cli import trace as trace_cli
    from oled_hf.cli.main import main

    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    monkeypatch.setattr(trace_cli, "resolve_model", lambda *a: (_ for _ in ()).throw(AssertionError("loaded")))
    for out, msg in ((prompts, "is the --prompts file: recording would overwrite its input"),
                     (tmp_path, "is a folder; give the path of a file to write"),
                     (tmp_path / "nope" / "t.trace", "does not exist")):
        assert main(["trace", "record", "--model", "x", "--prompts", str(prompts), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and msg in err[0], err
    assert prompts.read_text() == "hello\n"


def test_trace_replay_takes_systems_and_beliefs(tmp_path, capsys):
    from oled_hf.cli.main import main

    t = synthetic_trace(num_layers=2, num_experts=16, top_k=2, block_length=8, num_blocks=2, seed=1)
    path = tmp_path / "t.trace"
    t.save(str(path))
    assert main(["trace", "replay", str(path), "--cache-size", "4", "--system", "lru+cpu+reuse+adaptive", "oled",
                 "--believed-cpu-scale", "2"]) == 0
    out = capsys.readouterr().out
    assert "lru+cpu+reuse+adaptive" in out and "dispatcher believes CPU x2" in out
    assert main(["trace", "replay", str(path), "--cache-size", "4", "--system", "lru+warp"]) == 2
    assert "unknown part 'warp'" in capsys.readouterr().err


def test_no_system_is_below_the_valid_lp_bound():
    t = synthetic_trace(num_layers=2, num_experts=16, top_k=2, block_length=8, num_blocks=2, seed=1)
    from oled_hf.offload.costmodel import CostModel

    runs = run_systems(t, "x", SYSTEMS, (25, 40), CostModel.h200_pcie5(2048, 512, kernel="grouped"), 0.0,
                       lp_window=4)
    assert runs and all(r.bound_ratio and r.min_ratio for r in runs)
    for r in runs:
        assert r.x_bound >= 1.0 - 1e-9, (r.system, r.pct, r.x_bound)
    assert all(r.bound_ratio is None for r in run_systems(t, "x", SYSTEMS[:1], (25,), CostModel.h200_pcie5(
        2048, 512, kernel="grouped"), 0.0))  # lp_window 0: no LP bound


def test_run_systems_calibrate_turns_calibration_on_for_every_cpu_dispatch():
    from oled_hf.offload.costmodel import CostModel

    t = synthetic_trace(num_layers=2, num_experts=16, top_k=2, block_length=8, num_blocks=3, seed=2)
    cm = CostModel.h200_pcie5(2048, 512, kernel="grouped")
    systems = [s for s in SYSTEMS if s.name in ("oled", "mixtral-offloading", "tide")]
    runs = run_systems(t, "x", systems, (25,), cm, 0.0, bounds=False, believed=cm.believed(cpu_scale=2.0),
                       calibrate=True)
    got = {r.system: r.result.calibration for r in runs}
    assert got["oled"] and got["tide"]  # CPU dispatches learned scales
    assert not got["mixtral-offloading"]  # copy-only: nothing to calibrate
    plain = run_systems(t, "x", systems, (25,), cm, 0.0, bounds=False, believed=cm.believed(cpu_scale=2.0))
    assert not any(r.result.calibration for r in plain)


def _row(system, belief, pct, wrong, cal, true):
    return {"trace": "t", "pct": pct, "system": system, "belief": belief, "wrong_ms": wrong, "calibrated_ms": cal,
            "true_ms": true, "scales": None}


def test_belief_table_and_the_105_check():
    from oled_hf.sim.report_calibration import belief_table, calibration_checks

    rows = [_row("oled", "CPU x2", 25, 1.5, 1.05, 1.0), _row("oled", "PCIe x0.5", 25, 1.2, 1.0501, 1.0),
            _row("tide", "CPU x2", 25, 2.4, 2.1, 2.0), _row("oled", "CPU x2", 40, 3.0, 2.0, 2.0)]
    checks = calibration_checks(rows, (25, 40), ["CPU x2", "PCIe x0.5"])
    assert checks == [
        "- CPU x2, 25%: oled calibrated / true = 1.050 (believed / true 1.500) -> MET",
        "- CPU x2, 40%: oled calibrated / true = 1.000 (believed / true 1.500) -> MET",
        "- PCIe x0.5, 25%: oled calibrated / true = 1.050 (believed / true 1.200) -> MISSED"]
    table = belief_table(rows, 25, ["oled", "tide", "hybrimoe"], ["CPU x2", "PCIe x0.5"],
                         {"CPU x2": "0.900 (tide)"}).splitlines()
    assert table[0] == "| system | true TPOT ms | CPU x2: believed / calibrated | PCIe x0.5: believed / calibrated |"
    assert table[2] == "| oled | 1.000 | 1.500 / 1.050 | 1.200 / 1.050 |"
    assert table[3] == "| tide | 2.000 | 1.200 / 1.050 | - |"
    assert table[4] == "| oled / strongest fair (calibrated) | - | 0.900 (tide) | - |"
    assert len(table) == 5  # hybrimoe has no rows: left out


def test_calibration_rows_take_the_believed_run_for_an_uncalibrated_system():
    from types import SimpleNamespace as NS

    from oled_hf.sim.report_calibration import calibration_rows

    def run(system, ms, scales=None):
        return NS(system=system, pct=25, result=NS(tpot_s=ms * 1e-3, calibration=scales or {}))

    rows = calibration_rows("t", [run("oled", 1.0), run("mixtral-offloading", 5.0)],
                            {"CPU x2": [run("oled", 1.5), run("mixtral-offloading", 5.0)]},
                            {"CPU x2": [run("oled", 1.02, {"copy": 1.0})]})
    assert [(r["system"], r["wrong_ms"], r["calibrated_ms"], r["true_ms"]) for r in rows] == [
        ("oled", 1.5, 1.02, 1.0), ("mixtral-offloading", 5.0, 5.0, 5.0)]
    assert rows[0]["scales"] == {"copy": 1.0} and rows[1]["scales"] is None


def test_write_markdown_is_whole_or_nothing(tmp_path):
    from oled_hf.sim.report import write_markdown

    path = tmp_path / "report.md"
    write_markdown(path, ["# a", "b"])
    assert path.read_text() == "# a\n\nb\n" and [p.name for p in tmp_path.iterdir()] == ["report.md"]
    with pytest.raises(TypeError):
        write_markdown(path, ["# new", None])  # fails while building the text: the old report stays
    assert path.read_text() == "# a\n\nb\n" and [p.name for p in tmp_path.iterdir()] == ["report.md"]


def test_ablation_keeps_oleds_retention_knobs_on_oleds_retention_only():
    """A dev tuning may give oled retention knobs (the amortised usage split: reuse=usage); the ablation's rows with
    another retention (lru, the baseline's) take oled's dispatch knobs but not those (LRU refused them)."""
    from oled_hf.sim.report import ablation_systems

    hyb = next(s for s in SYSTEMS if s.name == "hybrimoe")
    tuned = {"oled": {"dispatch.reuse_copies": 0, "retention.reuse": "usage", "retention.usage_decay": 0.9},
             "hybrimoe": {"retention.decay": 0.5, "prefetch.limit": 4}}
    rows = dict(ablation_systems(hyb, tuned))
    for label, system in rows.items():
        own = {k for k in system.knobs if k.startswith("retention.")}
        if system.retention == "oled":
            assert own <= {"retention.reuse", "retention.usage_decay"}, label
        elif system.retention == "score":
            assert own == {"retention.decay"} and system.knobs["retention.decay"] == 0.5, label
        else:
            assert not own, label
    assert rows["(lru with the same parts as the last row)"].knobs.get("dispatch.reuse_copies") == 0
