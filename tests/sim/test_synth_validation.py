"""eval/synthetic_validation.py's ranking criterion (issue 38.3): same fastest, tau >= 0.9, three fastest +-10%."""

import importlib.util
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "synthetic_validation", Path(__file__).resolve().parents[2] / "eval" / "synthetic_validation.py")
sv = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(sv)


def _orders(real, syn, pcts=(25,)):
    """validation_rows' output for one size from {system: tpot} dicts (no replay)."""
    names = list(real)
    rows = {n: [(real[n], syn[n], (syn[n] - real[n]) / real[n], abs(syn[n] - real[n]) / real[n] <= 0.1)]
            for n in names}
    rank_r = sorted(names, key=real.get)
    rank_s = sorted(names, key=syn.get)
    tau = sv.kendall_tau([real[n] for n in names], [syn[n] for n in names])
    return rows, {pcts[0]: (tau, rank_r == rank_s, rank_r[0], rank_s[0], rank_r, rank_s)}


def test_criterion_passes_only_with_same_fastest_high_tau_and_top_three_within_10_percent():
    real = {"a": 1.0, "b": 1.1, "c": 1.2, "d": 2.0, "e": 3.0}
    rows, orders = _orders(real, {"a": 1.05, "b": 1.15, "c": 1.25, "d": 2.2, "e": 3.3})
    assert sv.criterion(rows, orders, pcts=(25,))[25][4] is True
    rows, orders = _orders(real, {"a": 1.12, "b": 1.15, "c": 1.25, "d": 2.2, "e": 3.3})  # a off by 12%
    fr, fs, tau, top, ok = sv.criterion(rows, orders, pcts=(25,))[25]
    assert not ok and (fr, fs) == ("a", "a") and tau == pytest.approx(1.0) and top[0] == ("a", pytest.approx(0.12))
    rows, orders = _orders(real, {"a": 1.1, "b": 1.05, "c": 1.25, "d": 2.2, "e": 3.3})  # b fastest: fails
    crit = sv.criterion(rows, orders, pcts=(25,))
    assert crit[25][:2] == ("a", "b") and not crit[25][4]
    table = sv.format_criterion([("toy", crit, 0.9)])
    assert "FAIL (fastest, tau<0.9" in table and "0/1 model-size cells pass" in table


def test_pairs_are_checked_before_any_work(tmp_path, capsys):
    f = tmp_path / "dev.trace"
    f.write_text("x")
    assert sv.main(["--pair", str(f), str(tmp_path / "missing.trace")]) == 2
    assert "--pair" in capsys.readouterr().err
    assert sv.main(["--pair", str(f), str(f), "--systems", "oled", "nope"]) == 2
    assert "--systems nope: unknown" in capsys.readouterr().err
    assert sv.main(["--pair", str(f), str(f), "--params", str(f), "--params", str(f)]) == 2
    assert "2 given for 1 trace pairs" in capsys.readouterr().err
    assert sv.main(["--dev", str(f)]) == 2
    assert "give both" in capsys.readouterr().err
