"""The upper side of the bracket around the optimum: the best of several offline schedules on one trace.

The lower side is the valid LP bound (``sim/bounds/lp.py``, and ``sim/bounds/coupled.py``); the upper
side is any schedule the timeline can run, so the least of several is kept. Each is timed as
``replay`` times a system (one warm-up handling, the true cost model) and pays the host planner time
per layer access that every system is charged (``planner_s``: an offline schedule would still be
executed by a planner; 0 gives the schedules' bare time):

* the greedy offline schedule (``sim/schedules/greedy.py``: Belady retention, per-access copy count chosen
  on the timeline, best over its reuse credits);
* the same greedy plus prefetches into the copy engine's idle time (``sim/schedules/search.py``, best
  over its variants): at deep 40% it ends 8.5% sooner than the greedy alone (3.28 vs 3.58x fused);
* replay with the ``belady`` retention oracle (it knows the whole future) under the strongest fair
  system's dispatch and allocation;
* the same oracle under pure caching (every miss copied, uniform split).

Neither side is the optimum: the report prints both, and the width between them is what nobody here
can yet attribute (to the LP's relaxation or to the schedules' myopia). ``eval/report/bracket.py``
prints the same rows for one trace; ``oled-moe report`` puts them in section (j).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oled_hf.offload.costmodel import CostModel
from oled_hf.offload.system import System

from ...offload.trace import Trace
from ..belady import request_sets
from ..demand import request_counts, timed_forwards
from ..ladder import pure_caching, rung_system
from ..replay import replay
from .greedy import accesses_of, best_greedy
from .search import PREFETCH_VARIANTS, best_search


@dataclass
class OfflineRows:
    """Seconds of each offline schedule (name, seconds) on one trace at one size; the least is the upper side."""

    rows: list[tuple[str, float]]

    @property
    def best_s(self) -> float:
        return min(t for _, t in self.rows)


def offline_schedules(trace: Trace, cm: CostModel, size: int, fair: System, warmup_sequences: int = 1,
                      timed: np.ndarray | None = None, planner_s: float = 0.0) -> OfflineRows:
    """Every offline schedule of the module docstring at ``size`` slots per layer (``fair``: whose dispatch the
    oracle replays keep). ``timed``: a mask of the forwards to time (a trace cut short) instead of every forward
    after ``warmup_sequences``; only the two greedy schedules then (replay times whole sequences).
    ``planner_s``: host seconds charged per layer access, as replay charges a system's planner."""
    if not (np.isfinite(planner_s) and planner_s >= 0):
        raise ValueError(f"planner_s={planner_s!r} is invalid: must be a number >= 0 (seconds per layer access)")
    counts = request_counts(trace)
    oracle_replays = timed is None
    timed = timed_forwards(trace, warmup_sequences) if timed is None else timed
    idx = np.flatnonzero(timed)
    if idx.size == 0:
        raise ValueError("offline schedules: the trace has no timed forward after its warm-up sequences")
    accs = accesses_of(counts, np.arange(int(idx[-1]) + 1))
    total, start = size * trace.num_layers, int(idx[0]) * trace.num_layers
    greedy, credit = best_greedy(accs, cm, total, timed_from=start, planner_s=planner_s)
    pre = best_search(accs, cm, total, timed_from=start, variants=PREFETCH_VARIANTS, planner_s=planner_s)
    v = pre.variant
    rows = [(f"greedy offline schedule (credit {credit:g})", greedy),
            (f"greedy + prefetch into idle copy time (credit {v.credit:g}, horizon {v.horizon}, extra {v.extra})",
             pre.time_s)]
    if oracle_replays:
        future = list(request_sets(trace))
        for label, base in (("belady + the strongest fair dispatch", fair),
                            ("belady, pure caching", pure_caching(fair))):
            r = replay(trace, label, size, system=rung_system(base, "belady", future), cost_model=cm,
                       planner_s=planner_s, warmup_sequences=warmup_sequences)
            rows.append((f"{label} (offline)", r.sim_time_s))
    return OfflineRows(rows)
