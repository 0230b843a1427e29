"""The learned-retention table's math (oled_hf/sim/capture.py): the share of the Belady rung's gain captured."""

import math

import pytest

from oled_hf.sim.capture import CaptureCell, captured_share, ratio_table, target_lines


def test_share_is_geometric_between_the_best_fixed_and_the_rung():
    assert captured_share(2.0, 2.0, 1.0) == 0.0
    assert captured_share(2.0, 1.0, 1.0) == 1.0
    assert captured_share(2.0, math.sqrt(2.0), 1.0) == pytest.approx(0.5)
    assert captured_share(2.0, 2.2, 1.0) < 0  # slower than the best fixed
    assert captured_share(2.0, 1.5, 2.0) is None and captured_share(2.0, 1.5, 2.5) is None  # no headroom
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="must be a positive finite number of seconds"):
            captured_share(bad, 1.0, 1.0)


def _cell(pct, learned, oled, lru, rung, offline=None):
    return CaptureCell("t", pct, "learned", {"learned": learned, "oled": oled, "lru-full": lru}, 1.0, rung, offline)


def test_the_best_fixed_is_the_fastest_other_system_and_the_table_lists_every_row():
    c = _cell(40, 4.0, 5.0, 4.5, 3.0, 3.2)
    assert c.best_fixed == ("lru-full", 4.5)
    assert c.share == pytest.approx(math.log(4.5 / 4.0) / math.log(4.5 / 3.0))
    table = ratio_table([_cell(25, 6.0, 6.5, 6.6, 5.0), c], ["learned", "oled", "lru-full"], [25, 40])
    assert "| learned | 6.00 / 4.00 |" in table and "| best offline schedule (planner charged) | - / 3.20 |" in table
    assert "| valid lower bound | - / - |" in table and "captured by learned |" in table


def test_targets_say_met_or_missed_with_the_margin():
    cells = [_cell(25, 6.0, 6.5, 6.6, 5.0), _cell(40, 4.0, 5.0, 4.5, 3.0, 3.5)]
    line = target_lines(cells)[0]
    assert "40%: 1.250x over oled (target 1.10x: MET)" in line
    assert "25%: 1.083x over oled (target 1.05x: MET)" in line
    assert "target <= 1.005x: MET" in line and "share at 40%: 0.29 (target 0.5: MISSED)" in line
    assert "40%: 1.14x the best offline schedule (target <= 1.25x: MET)" in line
    slow = target_lines([_cell(40, 5.1, 5.0, 5.2, 3.0)])[0]
    assert "missed by 1.122x" in slow and "1.0200x its time at 40% (oled; target <= 1.005x: MISSED)" in slow
