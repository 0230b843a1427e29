"""Where the headline system's time above the valid bound goes: a telescoping decomposition.

The system is re-run step by step, each step removing one cause with everything else unchanged;
each share is the time the step removes, so the shares sum exactly to ``system - LP bound``
(the order is fixed and stated, as shares of a telescoping sum depend on it):

1. ``planner``: the host planner's time per access (the report charges a stated constant); the
   same system replayed with a zero planner. The bound plans nothing.
2. ``retention (misses vs an offline schedule)``: the system's retention replaced by Belady's
   oracle (``belady``: it knows the whole future), its dispatch, prefetch and allocation kept;
   what better knowledge of which experts to keep would buy.
3. ``remaining: offline schedule -> LP bound``: the rest, i.e. the bracket's width where the
   oracle run is the best offline schedule known, plus whatever the oracle run still loses to it
   (routing discovered only at the router, the dispatcher's split, the allocator's split across
   layers), plus the relaxation's own gap (fractional schedules, windows that start from a free
   cache). These are *not* separated here.

Each step is a replay on the same timeline with the true cost model (``sim/replay.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from oled_hf.offload.costmodel import CostModel
from oled_hf.offload.system import System

from .belady import request_sets
from .replay import replay
from .trace import Trace

STEPS = ("planner", "retention (misses vs an offline schedule)", "remaining: offline schedule -> LP bound")


@dataclass
class Decomposition:
    """Seconds: the system's time, the bound's, and each step's share (summing to the difference)."""

    system_s: float
    bound_s: float
    shares: list[tuple[str, float]]

    def table(self, full_s: float) -> list[list[str]]:
        """Rows: step, ms, share of the gap, x fused it accounts for."""
        gap = self.system_s - self.bound_s
        rows = [["system", f"{1e3 * self.system_s:.2f}", "-", f"{self.system_s / full_s:.2f}"]]
        for name, s in self.shares:
            rows.append([name, f"{1e3 * s:.2f}", f"{s / gap:.0%}" if gap > 0 else "-", f"{s / full_s:.2f}"])
        rows.append(["valid LP bound", f"{1e3 * self.bound_s:.2f}", "-", f"{self.bound_s / full_s:.2f}"])
        return rows


def decompose(trace: Trace, system: System, size: int, cm: CostModel, planner_s: float, bound_s: float,
              warmup_sequences: int = 1) -> Decomposition:
    """The shares of ``system``'s time above ``bound_s`` at ``size`` slots per layer (module docstring)."""
    def run(s: System, planner: float) -> float:
        return replay(trace, "step", size, system=s, cost_model=cm, planner_s=planner,
                      warmup_sequences=warmup_sequences).sim_time_s

    t0 = run(system, planner_s)
    t1 = run(system, 0.0)
    knobs = {k: v for k, v in system.knobs.items() if not k.startswith("retention.")}
    oracle = dataclasses.replace(system, retention="belady", knobs=knobs).with_knobs(
        retention__future=list(request_sets(trace)))
    t2 = run(oracle, 0.0)
    shares = [(STEPS[0], t0 - t1), (STEPS[1], t1 - t2), (STEPS[2], t2 - bound_s)]
    assert np.isclose(sum(s for _, s in shares), t0 - bound_s)
    return Decomposition(t0, bound_s, shares)
