"""How much of the Belady rung's headroom a system captures: the learned-retention table.

Per held-out trace and cache size the table puts side by side: the system under test, the fixed
compositions (every report system but it), the Belady rung (Belady's retention, which knows the whole
future, under oled's dispatch and allocation with oled's dev-tuned knobs), the best offline schedule
(``sim/schedules/best.py``, charged the same planner time per access as every system) and the valid
lower bound. The share captured is geometric, so that halving a gap in log time counts one half:

    share = log(best fixed / system) / log(best fixed / Belady rung)

1 = the system is as fast as the Belady rung, 0 = as fast as the best fixed composition, negative =
slower than it. It is undefined (None) where the rung is not faster than the best fixed composition.

Pure data and formatting; ``eval/learned_retention.py`` runs the replays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class CaptureCell:
    """One trace at one size: seconds of each system, of the rung, of the best offline schedule; the bound."""

    trace: str
    pct: float
    ours: str  # the system under test
    seconds: dict[str, float] = field(default_factory=dict)  # every system (ours included), TPOT-proportional
    full_s: float = 0.0  # fused full residency
    rung_s: float = 0.0  # the Belady rung
    offline_s: float | None = None  # the best offline schedule (None: not computed)
    bound_ratio: float | None = None  # the valid lower bound over fused (None: not computed)

    @property
    def fixed(self) -> dict[str, float]:
        return {k: v for k, v in self.seconds.items() if k != self.ours}

    @property
    def best_fixed(self) -> tuple[str, float]:
        seconds, name = min((v, k) for k, v in self.fixed.items())
        return name, seconds

    @property
    def share(self) -> float | None:
        return captured_share(self.best_fixed[1], self.seconds[self.ours], self.rung_s)

    def x_fused(self, seconds: float) -> float:
        return seconds / self.full_s


def captured_share(best_fixed_s: float, ours_s: float, rung_s: float) -> float | None:
    """``log(best_fixed / ours) / log(best_fixed / rung)``; None where the rung is not faster than the best fixed."""
    for name, v in (("best_fixed_s", best_fixed_s), ("ours_s", ours_s), ("rung_s", rung_s)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ValueError(f"{name}={v!r} must be a positive finite number of seconds")
    if rung_s >= best_fixed_s:
        return None
    return math.log(best_fixed_s / ours_s) / math.log(best_fixed_s / rung_s)


def _f(x: float | None, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def ratio_table(cells: list[CaptureCell], systems: list[str], pcts: list[float]) -> str:
    """x fused per row (systems, the rung, the best offline schedule, the bound) and trace, one column per trace
    holding ``15 / 25 / 40``-style cells, then the share row."""
    traces = list(dict.fromkeys(c.trace for c in cells))
    by = {(c.trace, c.pct): c for c in cells}

    def row(label: str, value) -> list[str]:
        return [label] + [" / ".join(_f(value(by[(t, p)])) if (t, p) in by else "-" for p in pcts) for t in traces]

    rows = [row(s, lambda c, s=s: c.x_fused(c.seconds[s]) if s in c.seconds else None) for s in systems]
    rows.append(row("Belady rung (Belady retention, oled's dispatch and allocation)", lambda c: c.x_fused(c.rung_s)))
    rows.append(row("best offline schedule (planner charged)",
                    lambda c: None if c.offline_s is None else c.x_fused(c.offline_s)))
    rows.append(row("valid lower bound", lambda c: c.bound_ratio))
    rows.append(row(f"share of the Belady rung's gain over the best fixed composition captured by {cells[0].ours}",
                    lambda c: c.share))
    head = ["x fused at " + " / ".join(f"{p:g}%" for p in pcts)] + traces
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


@dataclass(frozen=True)
class Targets:
    """The learned-retention targets for the system under test, checked per trace."""

    over_oled_40: float = 1.10
    over_oled_25: float = 1.05
    slower_than_fixed: float = 1.005  # never more than 0.5% slower than any fixed composition
    share_at: tuple[float, ...] = (25, 40)
    share_min: float = 0.5
    offline_40: float = 1.25


def target_lines(cells: list[CaptureCell], targets: Targets = Targets(), oled: str = "oled") -> list[str]:
    """One line per trace: each target MET or MISSED, with by how much."""
    out = []
    for t in dict.fromkeys(c.trace for c in cells):
        mine = {c.pct: c for c in cells if c.trace == t}
        parts = []
        for pct, goal in ((40, targets.over_oled_40), (25, targets.over_oled_25)):
            c = mine.get(pct)
            if c is not None and oled in c.seconds:
                r = c.seconds[oled] / c.seconds[c.ours]
                parts.append(f"{pct:g}%: {r:.3f}x over oled (target {goal:.2f}x: "
                             + ("MET" if r >= goal else f"missed by {goal / r:.3f}x") + ")")
        worst = max((c.seconds[c.ours] / c.best_fixed[1], c.pct, c.best_fixed[0]) for c in mine.values())
        parts.append(f"worst against the best fixed: {worst[0]:.4f}x its time at {worst[1]:g}% ({worst[2]}; target "
                     f"<= {targets.slower_than_fixed:.3f}x: " + ("MET" if worst[0] <= targets.slower_than_fixed
                                                                 else "MISSED") + ")")
        for pct in targets.share_at:
            c = mine.get(pct)
            if c is not None:
                s = c.share
                parts.append(f"share at {pct:g}%: {_f(s)} (target {targets.share_min:g}: "
                             + ("-" if s is None else "MET" if s >= targets.share_min else "MISSED") + ")")
        c = mine.get(40)
        if c is not None and c.offline_s:
            r = c.seconds[c.ours] / c.offline_s
            parts.append(f"40%: {r:.2f}x the best offline schedule (target <= {targets.offline_40:.2f}x: "
                         + ("MET" if r <= targets.offline_40 else "MISSED") + ")")
        out.append(f"- {t}: " + "; ".join(parts))
    return out
