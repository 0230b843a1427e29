"""Lower bounds on the time of any schedule of a trace at a cache budget: four bounds, one entry.

Every bound is over the same timed forwards of the same trace, at ``total_slots`` GPU expert slots
over all layers (so it covers any split of the slots across layers, fixed or moving), and is
valid for every system replay times (``sim/replay.py``): each drops something the timeline
charges, never adds anything. They differ in what they drop, so in how tight they are:

========== ==================== ==================================================================
kind       module               what it drops (each module's docstring lists all of it)
========== ==================== ==================================================================
``min``    ``physical.py``      a CPU-served miss enters the cache without a copy; counts misses
                                (Belady's MIN), not their cost; loose, about 2x at 40%
``lp``     ``lp.py``            integrality (fractional residency, copies, CPU/GPU splits); each
                                window of forwards starts from a free cache
``coupled`` ``coupled.py``      as ``lp``, with the windows' cache states priced at their
                                boundaries (Lagrangian): tighter than ``lp`` by the prices reached
``dual``   ``dual.py``          no windows (the whole trace); drops Horn's rows beyond prefixes and
                                dyadic intervals: on short traces that use most experts, below ``lp``
========== ==================== ==================================================================

:func:`lower_bound` is the one entry the report, the demo's projection and ``eval/report/bracket.py``
call. Each result has ``time_s`` (the bound), ``full_time_s`` (fused residency over the same
forwards) and ``ratio_to_full``. The upper side of the bracket, schedules a timeline can run, is
``sim/schedules``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from oled_hf.offload.costmodel import CostModel

from ...offload.trace import Trace
from ..belady import global_min
from ..demand import request_counts, timed_forwards
from .coupled import CoupledResult, lp_bound_coupled
from .dual import DualBoundResult, dual_bound_counts
from .lp import LPBoundResult, lp_bound_counts
from .physical import BoundResult, bound_from_counts

# kind -> the options it takes (keyword arguments of lower_bound)
BOUNDS: dict[str, tuple[str, ...]] = {
    "min": (),
    "lp": ("window_forwards",),
    "coupled": ("window_forwards", "passes", "step0_us"),
    "dual": ("iterations",),
}

Bound = BoundResult | LPBoundResult | CoupledResult | DualBoundResult


def lower_bound(kind: str, trace: Trace, cm: CostModel, total_slots: int, warmup_sequences: int = 0, *,
                timed: np.ndarray | None = None, **options: Any) -> Bound:
    """The ``kind`` bound (``BOUNDS``) on ``trace`` at ``total_slots`` slots, timed by ``cm``.

    ``timed``: which forwards count (bool ``[F]``); default: those after ``warmup_sequences``
    sequences, as replay times them. ``options``: the kind's own (``window_forwards`` of the LP
    windows, ``passes``/``step0_us`` of the coupled prices, ``iterations`` of the dual ascent).
    """
    if kind not in BOUNDS:
        raise ValueError(f"bound {kind!r} is unknown; allowed: {', '.join(BOUNDS)}")
    extra = sorted(set(options) - set(BOUNDS[kind]))
    if extra:
        allowed = ", ".join(BOUNDS[kind]) or "none"
        raise ValueError(f"bound {kind!r} takes no option {', '.join(extra)}; its options: {allowed}")
    counts = request_counts(trace)
    timed = timed_forwards(trace, warmup_sequences) if timed is None else np.asarray(timed, dtype=bool)
    if kind == "min":
        hits = np.zeros(counts.shape, dtype=bool)
        global_min(counts > 0, total_slots, hit_out=hits)
        return bound_from_counts(counts, hits, timed, cm)
    if kind == "lp":
        return lp_bound_counts(counts, timed, cm, total_slots, **options)
    if kind == "coupled":
        return lp_bound_coupled(counts, timed, cm, total_slots, **options)
    return dual_bound_counts(counts, timed, cm, total_slots, **options)


__all__ = ["BOUNDS", "Bound", "lower_bound"]
