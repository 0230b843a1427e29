"""`oled-moe report`: a seed group (median and range over seeds) and a --like trace timed at its model's size."""

import re

import pytest

from oled_hf.sim.synthetic import synthetic_trace


def test_report_seed_group_and_flash_like_trace(tmp_path):
    pytest.importorskip("matplotlib")
    from oled_hf.cli.main import main

    paths = []
    for seed in (1, 2, 3):
        t = synthetic_trace(num_layers=2, num_experts=16, top_k=2, block_length=8, num_blocks=2, seed=seed)
        paths.append(tmp_path / f"tiny-s{seed}.trace")
        t.save(str(paths[-1]))
    flash = synthetic_trace(num_layers=2, num_experts=16, top_k=2, block_length=8, num_blocks=2, seed=7)
    flash.header["model"] = "synthetic (like llada2.0-flash)"  # as `trace synth --like llada2.0-flash` names it
    paths.append(tmp_path / "flash-like-s1.trace")
    flash.save(str(paths[-1]))
    out = tmp_path / "rep"
    assert main(["report", *map(str, paths), "--out", str(out), "--sizes", "25", "--planner-us", "10",
                 "--lp-window", "4", "--as-model", "llada2.0-mini", "--quiet"]) == 0
    md = (out / "report.md").read_text()
    # the flash-like trace is timed at flash's expert size (4096 x 1024 x 3 x bf16), the others at mini's
    assert re.search(r"^\| flash-like-s1 \|.*\| llada2\.0-flash \(24\.00 MiB\) \|$", md, re.M)
    assert re.search(r"^\| tiny-s2 \|.*\| llada2\.0-mini \(6\.00 MiB\) \|$", md, re.M)
    assert re.findall(r"^## (flash-like-s1|tiny-s\d)$", md, re.M) == ["flash-like-s1"]  # no section per seed
    assert "## tiny: 3 seeds (tiny-s1, tiny-s2, tiny-s3)" in md
    group = md[md.index("## tiny: 3 seeds"):md.index("## flash-like-s1")]
    assert "computed on seed s1 only, and the later seeds replay at the headline sizes only" in group, group[:900]
    assert "| 25%: x fused | 40%: x fused | 15%: x bound (LP, seed s1) |" in group
    assert re.search(r"^- 25%: oled [0-9.]+ \[[0-9.]+-[0-9.]+\]x fused; strongest fair / oled = [0-9.]+ "
                     r"\[[0-9.]+-[0-9.]+\] .* oled lowest TPOT on \d of 3 seeds$", group, re.M)
    (row,) = re.findall(r"^\| oled \|.*$", group.split("<details>")[0], re.M)
    cells = [re.fullmatch(r"([0-9.]+) \[([0-9.]+)-([0-9.]+)\]", c.strip()).groups() for c in row.split("|")[2:-1]]
    assert len(cells) == 6 and all(lo <= med <= hi for med, lo, hi in (map(float, c) for c in cells))
    assert all(c[0] == c[1] == c[2] for c in cells[3:])  # x bound (LP): one seed, so median = min = max
    for label in ("tiny-s1", "tiny-s2", "tiny-s3"):
        assert f"#### {label}\n" in group
    targets = re.findall(r"^- (?:15|25|40)%: oled [0-9.]+x over the strongest composition .*$", group, re.M)
    assert len(targets) == 9  # three sizes on each seed
    # the flash-like workload prints every assumed figure with its source
    fl = md[md.index("## flash-like-s1"):]
    assert "### Figures and their sources: synthetic, like llada2.0-flash" in fl
    assert "- 31 MoE layers x 256 experts, top-8: assumed:" in fl
    assert "| tokens per forward | 3.5 |" in fl
    ladder = md[md.index("## (i) Oracle ladder"):]
    assert "### tiny-s1 " in ladder and "### tiny-s2 " not in ladder  # a group's first seed only


def test_dev_for_tunes_a_workload_on_its_own_dev_traces(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from oled_hf.cli.main import main

    def save(name, seed, top_k=2):
        t = synthetic_trace(num_layers=2, num_experts=16, top_k=top_k, block_length=8, num_blocks=2, seed=seed)
        t.save(str(tmp_path / name))
        return str(tmp_path / name)

    held = [save("tiny-s1.trace", 1), save("tiny-s2.trace", 2), save("other.trace", 5)]
    devs = [save("tiny-dev-a.trace", 11), save("tiny-dev-b.trace", 12)]
    deep_dev = save("deep-dev.trace", 21, top_k=4)
    out = tmp_path / "rep"
    for bad, msg in ((["--dev-for", "nope=" + devs[0]], "'nope' names no trace or seed group of this report; "
                                                         "allowed: other, tiny, tiny-s1, tiny-s2"),
                     (["--dev-for", "tiny"], "expected NAME=PATH[,PATH...]"),
                     (["--dev-for", f"tiny={held[2]}"], "is a held-out trace of this report; tune on dev traces only"),
                     (["--dev-for", f"tiny={tmp_path / 'missing.trace'}"], "missing.trace: no such file"),
                     (["--dev-for", f"tiny={devs[0]}", "--dev-for", f"tiny={devs[1]}"], "'tiny' is given twice")):
        assert main(["report", *held, "--out", str(out), *bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and msg in err[0], err
    assert not out.exists()  # refused before any work
    assert main(["report", *held, "--dev", deep_dev, "--dev-for", "tiny=" + ",".join(devs), "--out", str(out),
                 "--sizes", "25", "--planner-us", "10", "--lp-window", "0", "--as-model", "llada2.0-mini",
                 "--quiet"]) == 0
    md = (out / "report.md").read_text()
    systems = md[md.index("## Systems"):md.index("## tiny: 2 seeds")]
    assert "on the dev split (`deep-dev.trace`)" in systems
    assert "The traces of `tiny` were tuned instead on its own dev split (`tiny-dev-a.trace`, `tiny-dev-b.trace`;" \
        in systems
    assert systems.count("| oled | oled | none | cpu+reuse | adaptive |") == 2  # one table per tuning
