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
