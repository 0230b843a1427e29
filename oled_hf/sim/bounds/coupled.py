"""The LP bound with windows that carry the cache across their boundaries: Lagrangian prices.

Why: ``lp_bound`` cuts the trace into windows that each start from a free cache (any
``total_slots`` experts). That is valid but loose where the cache holds much of a window's working
set (40% of expert memory): every window gets its working set for nothing, so misses that a real
schedule pays to *change* its cache between windows vanish. Joining the windows into one LP is too
large to solve; overlapping windows that count only their inner part are *not* a bound (the outer
part would refill the cache for free).

The coupled problem is the windows' LPs plus, at each boundary k, ``x_{k+1,i} = e_{k,i}``: the
residency of item ``i`` at the start of window k+1 is what window k leaves landed at its end
(``solve_window`` with prices models both: the start state as landed residency, the one copy
running at the start as slack, and the end state as items kept from their last request, kept
idle from the start, or copied to land by the end). Relaxing these equalities with prices
``lambda_{k,i} >= 0`` gives, for every choice of prices,

    L(lambda) = sum_k min_{window k} [ time_k + sum_i lambda_{k-1,i} x_{k,i} - sum_i lambda_{k,i} e_{k,i} ],

a lower bound of the coupled LP (weak duality: the real schedule's projection is feasible in
each window, and its price terms telescope to zero because its start state of k+1 *is* its end
state of k), hence of every schedule the timeline can run. The first window's start is free (a
warm-up leaves any cache), the last window's end earns nothing. The first pass (all prices 0) is
the free-cache bound with the landed-state start; the prices then follow projected subgradient
steps ``lambda <- max(0, lambda + step_t (x_{k+1} - e_k))`` (items the next window wants but this
one does not leave become dearer), ``step_t = step0 / (t + 1)`` (``step0`` a sixth of a copy by
default). Every pass is a valid bound; the result is the best pass. Uniform prices would be
useless (items are fungible under them: a window could keep any set and sell it on); the prices are per item.

What it drops beyond ``lp_bound``'s relaxation: the duality gap at the prices reached (a few
passes, not the optimum of L), a copy landing in window k and counted as its end state but
released before the item's last request (end copies have no release time), and end copies'
engine intervals other than the window's whole.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from oled_hf.offload.costmodel import CostModel

from ..demand import full_time
from .lp import US, Requests, solve_window, window_requests

STEP0_COPIES = 0.16  # first subgradient step, in expert copies (20 us at mini's expert on PCIe 5)


@dataclass
class CoupledResult:
    """The best pass's bound (seconds), every pass's, and the fused-resident time."""

    time_s: float
    full_time_s: float
    passes_s: list[float] = field(default_factory=list)
    window_forwards: int = 2
    num_windows: int = 0
    solve_s: float = 0.0

    @property
    def ratio_to_full(self) -> float:
        return self.time_s / self.full_time_s if self.full_time_s > 0 else float("nan")


def coupled_pass(reqs: list[Requests], cm: CostModel, total_slots: int,
                 prices: list[np.ndarray]) -> tuple[float, list[np.ndarray], list[np.ndarray]]:
    """One pass at boundary prices ``prices[k]`` (between windows k and k+1, microseconds per item).

    Returns ``(L(prices) in seconds, start states, end states)`` of the windows.
    """
    K = len(reqs)
    if len(prices) != max(K - 1, 0):
        raise ValueError(f"prices: {len(prices)} boundaries given, the {K} windows have {max(K - 1, 0)}")
    total, starts, ends = 0.0, [], []
    zero = np.zeros(reqs[0].num_items) if reqs else None
    for k, req in enumerate(reqs):
        w = solve_window(req, cm, total_slots, first_nonexpert=k > 0,
                         price_in=prices[k - 1] if k > 0 else None,
                         price_out=prices[k] if k < K - 1 else zero)
        total += w.time_s
        starts.append(w.start_state)
        ends.append(w.end_state)
    return total, starts, ends


def lp_bound_coupled(counts: np.ndarray, timed: np.ndarray, cm: CostModel, total_slots: int,
                     window_forwards: int = 2, passes: int = 4, step0_us: float | None = None) -> CoupledResult:
    """The coupled bound (module docstring) over token counts ``[L, F, E]`` and a timed mask ``[F]``.

    ``passes``: LP passes over all windows (the first at prices 0); ``step0_us``: the first
    subgradient step in microseconds per unit of mismatch (default ``STEP0_COPIES`` expert copies:
    a whole copy overshoots on the deep toy and the pass goes below the free-cache bound).
    """
    if total_slots < 1:
        raise ValueError(f"total_slots={total_slots} must be >= 1")
    if window_forwards < 1:
        raise ValueError(f"window_forwards={window_forwards} must be >= 1")
    if passes < 1:
        raise ValueError(f"passes={passes} must be >= 1")
    fw = np.flatnonzero(timed)
    reqs = [window_requests(counts, fw[s:s + window_forwards]) for s in range(0, fw.size, window_forwards)]
    step0 = STEP0_COPIES * cm.copy_time() * US if step0_us is None else float(step0_us)
    if not (np.isfinite(step0) and step0 > 0):
        raise ValueError(f"step0_us={step0_us!r} must be a finite number > 0")
    prices = [np.zeros(reqs[0].num_items) for _ in range(len(reqs) - 1)]
    values: list[float] = []
    t0 = time.perf_counter()
    for t in range(passes):
        value, starts, ends = coupled_pass(reqs, cm, total_slots, prices)
        values.append(value)
        if t + 1 < passes:
            step = step0 / (t + 1)
            prices = [np.maximum(0.0, p + step * (starts[k + 1] - ends[k])) for k, p in enumerate(prices)]
    return CoupledResult(max(values), full_time(counts, timed, cm), values, window_forwards, len(reqs),
                         time.perf_counter() - t0)
