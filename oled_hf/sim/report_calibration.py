"""Believed vs calibrated vs true: the TPOT of a wrong starting belief, with and without online calibration.

A dispatcher decides copy vs CPU from a cost model, its belief; ``dispatch.calibrate=1``
(``oled_hf/offload/online_calibration.py``) corrects a wrong belief online from measured copy and CPU
times (replay feeds it the true times with lognormal noise, seeded: ``replay.replay``'s
``measure_sigma`` / ``measure_seed``). Calibration is a dispatch part, so every dispatch with the CPU
gets it; a copy-only dispatch reads no cost and is left as it is (``calibrated``).

One row per (trace, size, system, belief) as ``{"trace", "pct", "system", "belief", "wrong_ms",
"calibrated_ms", "true_ms", "scales"}``: ``eval/calibration_sweep.py`` prints them long
(``format_table``) and the report's section (h) wide, one table per size (``belief_table``), with the
check that calibration recovers the truth (``calibration_checks``: oled calibrated <= ``CAL_LIMIT`` x
oled true). Pure data and formatting; no import of ``sim/report.py`` (which imports this).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from oled_hf.offload.system import System

CAL_LIMIT = 1.05  # calibrated TPOT within 5% of the true belief's


def calibrated(system: System) -> System:
    """``system`` with online calibration on, where its dispatch reads costs (every dispatch but ``copy``)."""
    return system if system.dispatch == "copy" else system.with_knobs(dispatch__calibrate=1)


def calibration_rows(trace: str, truth: list, believed: dict[str, list],
                     calibrated_runs: dict[str, list]) -> list[dict]:
    """Rows of (trace, size, system, belief) from ``report.Run`` lists: true, per belief wrong and calibrated.

    A system missing from a belief's calibrated runs (a copy-only dispatch, not re-run) takes its
    believed run: with nothing to calibrate the two are the same replay."""
    true_by = {(r.system, r.pct): r for r in truth}
    rows = []
    for belief, runs in believed.items():
        cal_by = {(r.system, r.pct): r for r in calibrated_runs.get(belief, [])}
        for r in runs:
            t = true_by.get((r.system, r.pct))
            if t is None:
                continue
            c = cal_by.get((r.system, r.pct), r)
            rows.append({"trace": trace, "pct": r.pct, "system": r.system, "belief": belief,
                         "wrong_ms": 1e3 * r.result.tpot_s, "calibrated_ms": 1e3 * c.result.tpot_s,
                         "true_ms": 1e3 * t.result.tpot_s, "scales": c.result.calibration or None})
    return rows


def fmt_scales(scales: dict[str, float] | None) -> str:
    """Calibrated / believed per term (the true belief is at 1 / the believed scale)."""
    if not scales:
        return "-"
    return " ".join(f"{k}={v:.2f}" for k, v in scales.items())


def format_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: believed vs calibrated vs true, one row per (trace, size, system, belief)."""
    out = ["| trace | cache | system | belief | believed (wrong) ms | calibrated ms | true ms | wrong/true | "
           "cal/true | learned scales |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['trace'].rsplit('/', 1)[-1]} | {r['pct']:g}% | {r['system']} | {r['belief']} | "
                   f"{r['wrong_ms']:.3f} | {r['calibrated_ms']:.3f} | {r['true_ms']:.3f} | "
                   f"{r['wrong_ms'] / r['true_ms']:.3f} | {r['calibrated_ms'] / r['true_ms']:.3f} | "
                   f"{fmt_scales(r.get('scales'))} |")
    cal = [r["calibrated_ms"] / r["true_ms"] for r in rows]
    wrong = [r["wrong_ms"] / r["true_ms"] for r in rows]
    if rows:
        out.append(f"\nworst wrong/true {max(wrong):.3f}; worst cal/true {max(cal):.3f}; "
                   f"rows with cal/true <= {CAL_LIMIT:g}: {sum(c <= CAL_LIMIT for c in cal)} of {len(cal)}")
    return "\n".join(out)


def _at(rows: list[dict], pct: float) -> dict[tuple[str, str], dict]:
    return {(r["system"], r["belief"]): r for r in rows if r["pct"] == pct}


def belief_table(rows: list[dict], pct: float, systems: Iterable[str], beliefs: Iterable[str],
                 margins: dict[str, str] | None = None) -> str:
    """Wide markdown at one size: a row per system, its true TPOT, then per belief "believed / calibrated" / true.

    ``margins``: an extra last row (belief -> cell), e.g. oled / strongest fair under the calibrated beliefs."""
    beliefs = list(beliefs)
    at = _at(rows, pct)
    head = ["system", "true TPOT ms"] + [f"{b}: believed / calibrated" for b in beliefs]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in systems:
        got = [at.get((name, b)) for b in beliefs]
        if not any(got):
            continue
        true_ms = next(g["true_ms"] for g in got if g)
        cells = [f"{g['wrong_ms'] / g['true_ms']:.3f} / {g['calibrated_ms'] / g['true_ms']:.3f}" if g else "-"
                 for g in got]
        lines.append("| " + " | ".join([name, f"{true_ms:.3f}", *cells]) + " |")
    if margins:
        lines.append("| " + " | ".join(["oled / strongest fair (calibrated)", "-",
                                        *[margins.get(b, "-") for b in beliefs]]) + " |")
    return "\n".join(lines)


def calibration_checks(rows: list[dict], pcts: Iterable[float], beliefs: Iterable[str], ours: str = "oled",
                       limit: float = CAL_LIMIT) -> list[str]:
    """Per belief and size: oled calibrated / oled true <= ``limit`` -> MET or MISSED (and believed / true)."""
    lines = []
    for b in beliefs:
        for pct in pcts:
            r = _at(rows, pct).get((ours, b))
            if r is None:
                continue
            cal, wrong = r["calibrated_ms"] / r["true_ms"], r["wrong_ms"] / r["true_ms"]
            lines.append(f"- {b}, {pct:g}%: {ours} calibrated / true = {cal:.3f} (believed / true {wrong:.3f}) "
                         f"-> {'MET' if cal <= limit else 'MISSED'}")
    return lines
