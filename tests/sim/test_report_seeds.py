"""report_seeds: seed groups of one synthetic workload, medians and ranges over seeds, --like models."""

from types import SimpleNamespace as NS

from oled_hf.sim.report_seeds import fastest_counts, like_model, seed_groups, seed_margin_lines, seed_table, spread


def _run(system, pct, x, bound=None):
    r = NS(system=system, pct=pct, result=NS(ratio_to_full=x, tpot_s=x * 1e-3), bound_ratio=bound)
    r.x_bound = x / bound if bound else float("nan")
    return r


def _three_seeds():
    # seed -> (oled, lru-full, tide) x fused at 25%; the LP bound on seed 1 only
    xs = {1: (2.0, 2.5, 4.0), 2: (3.0, 2.0, 4.0), 3: (10.0, 11.0, 12.0)}
    return {s: [_run(n, 25, x, 1.0 if s == 1 else None) for n, x in zip(("oled", "lru-full", "tide"), v)]
            for s, v in xs.items()}


def test_seed_groups_need_two_seeds_of_one_name():
    got = seed_groups(["mini-like-s2", "deep-b16-bs1", "mini-like-s1", "mini-like-s10", "flash-like-s1", "x-s"])
    assert got == {"mini-like": [(1, "mini-like-s1"), (2, "mini-like-s2"), (10, "mini-like-s10")]}


def test_seed_table_gives_median_and_range_over_seeds():
    lines = seed_table(_three_seeds(), ["oled", "lru-full", "tide", "hybrimoe"], (25,), "seed s1").splitlines()
    assert lines[0] == "| system | 25%: x fused | 25%: x bound (LP, seed s1) |"
    assert lines[2] == "| oled | 3.00 [2.00-10.00] | 2.00 [2.00-2.00] |"
    assert lines[3] == "| lru-full | 2.50 [2.00-11.00] | 2.50 [2.50-2.50] |"
    assert lines[4] == "| tide | 4.00 [4.00-12.00] | 4.00 [4.00-4.00] |"
    assert lines[5] == "| LP bound (valid) | 1.00 [1.00-1.00] | 1.00 |"
    assert len(lines) == 6  # hybrimoe never ran
    no_lp = {s: [_run(r.system, r.pct, r.result.ratio_to_full) for r in v] for s, v in _three_seeds().items()}
    assert seed_table(no_lp, ["oled"], (25,)).splitlines() == [  # no LP anywhere: no x bound columns
        "| system | 25%: x fused |", "|---|---|", "| oled | 3.00 [2.00-10.00] |"]


def test_seed_margin_is_median_and_range_of_strongest_over_oled():
    (line,) = seed_margin_lines(_three_seeds(), (25,))
    # per seed strongest fair / oled: 2.5/2 = 1.25, 2/3 = 0.667, 11/10 = 1.1
    assert line == ("- 25%: oled 3.00 [2.00-10.00]x fused; strongest fair / oled = 1.100 [0.667-1.250] (> 1: oled "
                    "faster); strongest fair per seed: lru-full 3x; oled lowest TPOT on 2 of 3 seeds")
    assert fastest_counts(_three_seeds(), ["oled", "lru-full", "tide"], 25) == {"oled": 2, "lru-full": 1}
    assert spread([3.0, 1.0, 2.0, 10.0], ".1f") == "2.5 [1.0-10.0]"


def test_like_model_reads_the_synth_header():
    assert like_model("synthetic (like llada2.0-flash)") == "llada2.0-flash"
    assert like_model("synthetic") is None and like_model("/models/llada2.0-mini") is None
