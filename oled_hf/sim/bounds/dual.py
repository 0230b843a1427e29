"""A whole-trace valid lower bound by Lagrangian duality: no windows, so no free cache at window starts.

Why: ``lp.py`` solves its LP in windows of a few forwards, each starting from a free cache. At
25-40% the cache holds much of a window's working set, so the windows pay few copies: on the deep
toy at 40% the bound is 1.11x fused in 2-forward windows, 1.76x in 8-forward ones, while the best
offline schedule is 3.28x. A whole trace is too large for HiGHS, but a relaxation of the same
timeline with its coupling rows priced splits into one tiny shortest path per expert; any prices
give a valid bound, so the bound covers the whole trace and is raised by subgradient ascent.

Relaxed model R, over the timed layer accesses tau = 0..N-1 in trace order (as ``lp.py``):
each request j (access tau_j, item = layer x expert, n_j tokens) is served on the GPU, which needs
the item resident, or on the CPU. The item is resident at j if it was kept in a slot since its
previous request (or since the start: any initial cache is free, as in the LP and the exhaustive
search), or if a copy for j landed during some access s after the previous request's (s <= tau_j),
then holding its slot until j. Rows kept:

* slots: at each boundary b (just before access b) at most ``S`` items are held (kept, or landed
  and waiting for their request);
* per access ``M_tau >= ne + gfix y + sum_gpu gt_j`` and ``M_tau >= ne + cfix z + sum_cpu ct_j`` with
  ``y >= g_j`` (one launch if any expert runs on the GPU) and ``z >= 1 - g_j`` (one CPU batch);
* the copy engine (one, serial): copies landing by the end of access b take at most the time
  elapsed, ``cs * lands(<= b) <= sum_{tau <= b} M_tau`` (the LP's cumulative row), and for every
  dyadic interval I of accesses ``cs * (lands(I) - 1) <= sum_{tau in I} M_tau`` (all but the one copy
  running at I's start are done inside I).

Dropped beyond the LP's own drops (each only lowers the bound): Horn's rows for intervals that are
neither prefixes nor dyadic, the one-copy slack of each interval row (so no exact per-access
demand-copy row), and the LP's second slot snapshot within an access. On small traces whose
accesses use most experts (where windows lose little) it is therefore below the windowed LP; the
report keeps the larger of the two.

Duality. Price the slot rows with ``lam_b >= 0``, the prefix rows with ``rho_b >= 0`` (``sum rho <=
1``; ``P_tau = sum_{b >= tau} rho_b``), the interval rows with ``sigma_I >= 0`` (``S_tau`` the sum
over the intervals holding tau, ``P + S <= 1``), the launch and batch rows with ``kappa_j, pi_j >= 0``,
and split each access's weight ``w = 1 - P - S`` between its two duration rows as ``w mu`` and
``w (1 - mu)``. Eliminating ``M``, for fixed prices every item is independent: a request costs
``w mu gt + kappa`` on the GPU or ``w (1 - mu) ct + pi`` on the CPU, a copy landing at s
``cs (P_s + S_s)`` plus the slot prices from s + 1 to its request, keeping across a gap the slot
prices it spans; a two-state (resident or not) shortest path per item (``_chains``, numba, with a
range-minimum table for the landing access) gives the minimum, ``y`` and ``z`` follow their
coefficients, and the rows' violations are a subgradient. ``L <= R's optimum <= the timeline's
optimum`` for every feasible price vector (weak duality); the ascent (Polyak steps per block of
prices, aimed 5% above the best value so far) keeps the best L.

Checked: random prices and the ascent stay below exhaustive search on tiny traces, and every
replayed system stays above it (``tests/sim/bounds/test_dual.py``). Cost: ~40 ms per ascent step on
the deep toy's held-out trace (8 x 256, 902 forwards), ~0.2 s on a mini-like one (19 x 256).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from oled_hf.offload.costmodel import CostModel

from ...offload.trace import Trace
from ..demand import full_time, request_counts, timed_forwards
from .lp import US, window_requests

DECAY = 0.995  # step-scale factor after an ascent step that does not improve the best value
STARTS = (0.1, 0.5)  # starting weights of the whole-trace copy row; one ascent from each, the best kept
DEFAULT_ITERATIONS = 1000  # ascent steps from each start


@njit(cache=True)
def _sparse_min(h):  # pragma: no cover - compiled
    """Sparse table of ``(min, argmin)`` of ``h`` over power-of-two ranges (range-minimum in O(1))."""
    n = h.size
    levels = 1
    while (1 << levels) <= n:
        levels += 1
    val = np.empty((levels, n))
    arg = np.empty((levels, n), dtype=np.int64)
    for i in range(n):
        val[0, i] = h[i]
        arg[0, i] = i
    for k in range(1, levels):
        half = 1 << (k - 1)
        for i in range(n - (1 << k) + 1):
            if val[k - 1, i] <= val[k - 1, i + half]:
                val[k, i], arg[k, i] = val[k - 1, i], arg[k - 1, i]
            else:
                val[k, i], arg[k, i] = val[k - 1, i + half], arg[k - 1, i + half]
    return val, arg


@njit(cache=True)
def _range_min(val, arg, lo, hi):  # pragma: no cover - compiled
    """``(min, argmin)`` of the table's array over ``lo..hi`` inclusive."""
    k = 0
    while (1 << (k + 1)) <= hi - lo + 1:
        k += 1
    a, b = val[k, lo], val[k, hi - (1 << k) + 1]
    if a <= b:
        return a, arg[k, lo]
    return b, arg[k, hi - (1 << k) + 1]


@njit(cache=True)
def _chains(order, starts, access, gcost, ccost, land_base, lam_prefix):  # pragma: no cover - compiled
    """Per item, the cheapest schedule of its requests (``order`` grouped by item, time-sorted;
    ``starts`` the group offsets). A copy for a request at access t lands at some access s in
    (previous request's access, t] for ``land_base[s] + lam_prefix[t + 1]`` (its engine price plus the
    slots it holds from s + 1 to t). Returns the total and, per request, kept since the previous one /
    the landing access of its copy (-1: none) / served on the GPU."""
    J = order.size
    val, arg = _sparse_min(land_base)
    R = np.empty(J)
    Nn = np.empty(J)
    keep_choice = np.zeros(J, dtype=np.bool_)
    land_at = np.full(J, -1, dtype=np.int64)
    res_after_choice = np.zeros(J, dtype=np.bool_)  # N_k came from R_k (resident during k, dropped after)
    kept = np.zeros(J, dtype=np.bool_)
    landing = np.full(J, -1, dtype=np.int64)
    gpu = np.zeros(J, dtype=np.bool_)
    total = 0.0
    for g in range(starts.size - 1):
        a, b = starts[g], starts[g + 1]
        r_prev, n_prev = 0.0, 0.0  # before the first request: resident (initial cache, free) or not
        t_prev = -1
        for p in range(a, b):
            j = order[p]
            t = access[j]
            best_prev = min(r_prev, n_prev)
            keep_c = r_prev + lam_prefix[t + 1] - lam_prefix[t_prev + 1]  # boundaries t_prev + 1 .. t
            m, s = _range_min(val, arg, t_prev + 1, t)
            copy_c = best_prev + m + lam_prefix[t + 1]
            land_at[p] = s
            keep_choice[p] = keep_c <= copy_c
            r = (keep_c if keep_choice[p] else copy_c) + min(gcost[j], ccost[j])
            cpu_c = best_prev + ccost[j]
            res_after_choice[p] = r <= cpu_c
            R[p] = r
            Nn[p] = r if res_after_choice[p] else cpu_c
            r_prev, n_prev, t_prev = r, Nn[p], t
        total += n_prev
        state_r = False  # the end state: not resident (N <= R)
        for p in range(b - 1, a - 1, -1):
            j = order[p]
            if state_r or res_after_choice[p]:  # resident during request p
                gpu[j] = gcost[j] <= ccost[j]
                if keep_choice[p]:
                    kept[j] = True
                    state_r = True
                    continue
                landing[j] = land_at[p]
            state_r = p > a and R[p - 1] <= Nn[p - 1]
    return total, kept, landing, gpu


@dataclass
class DualBoundResult:
    """The best dual value found (a valid bound, seconds), fused residency, and the ascent's history."""

    time_s: float
    full_time_s: float
    iterations: int
    solve_s: float
    history: list[float] = field(default_factory=list)

    @property
    def ratio_to_full(self) -> float:
        return self.time_s / self.full_time_s if self.full_time_s > 0 else float("nan")


@dataclass
class _Problem:
    """The whole timed trace as flat arrays (microseconds)."""

    N: int
    access: np.ndarray
    order: np.ndarray
    starts: np.ndarray
    prev_access: np.ndarray  # [J] access of the item's previous request, -1 at its first
    gt: np.ndarray
    ct: np.ndarray
    ne: np.ndarray
    cs: float
    gfix: float
    cfix: float
    slots: int


def _problem(counts: np.ndarray, timed: np.ndarray, cm: CostModel, total_slots: int) -> _Problem:
    req = window_requests(counts, np.flatnonzero(timed))
    N = req.num_accesses
    order = np.lexsort((req.access, req.item))
    item_sorted = req.item[order]
    bounds = np.r_[True, item_sorted[1:] != item_sorted[:-1], True]
    starts = np.flatnonzero(bounds) if order.size else np.zeros(1, np.int64)
    prev_access = np.where(req.prev >= 0, req.access[np.maximum(req.prev, 0)], -1)
    ne = np.full(N, cm.nonexpert_s_per_layer * US)
    if N:
        ne[0] = 0.0  # as the LP: the first timed access's non-expert part is dropped
    return _Problem(N, req.access, order.astype(np.int64), starts.astype(np.int64), prev_access,
                    cm.gpu_times(req.tokens) * US, cm.cpu_times(req.tokens) * US, ne,
                    cm.copy_time() * US, cm.gpu_layer_fixed_s * US, cm.cpu_overhead_s * US, int(total_slots))


def _levels(n: int) -> list[tuple[int, int, int]]:
    """The dyadic intervals of ``n`` accesses: per level ``(offset in the flat price array, 2**k, intervals)``."""
    out, off, size = [], 0, 1
    while True:
        count = -(-n // size)
        out.append((off, size, count))
        off += count
        if size >= n:
            return out
        size *= 2


def interval_count(n: int) -> int:
    """How many dyadic intervals (interval prices) ``n`` accesses have."""
    off, _, count = _levels(n)[-1]
    return off + count


def suffix_sums(rho: np.ndarray) -> np.ndarray:
    """``P_tau = sum_{b >= tau} rho_b``: the weight of the prefix copy rows on access tau."""
    return np.cumsum(rho[::-1])[::-1]


def _per_access(sigma: np.ndarray, n: int) -> np.ndarray:
    """``S_t``: the sum of the interval prices over the dyadic intervals holding access t."""
    S = np.zeros(n)
    for off, size, count in _levels(n):
        S += np.repeat(sigma[off:off + count], size)[:n]
    return S


def _per_interval(v: np.ndarray) -> np.ndarray:
    """Sums of ``v`` over every dyadic interval, in the flat price layout."""
    return np.concatenate([np.add.reduceat(v, np.arange(0, v.size, size)) for _, size, _ in _levels(v.size)])


def _repair(sigma: np.ndarray, P: np.ndarray) -> None:
    """Lower interval prices, finest first, until ``P + S <= 1`` for every access (in place)."""
    n = P.size
    excess = P + _per_access(sigma, n) - 1.0
    for off, size, cnt in _levels(n):
        if (excess <= 0).all():
            return
        worst = np.maximum.reduceat(excess, np.arange(0, n, size))
        cut = np.minimum(sigma[off:off + cnt], np.maximum(worst, 0.0))
        sigma[off:off + cnt] -= cut
        excess -= np.repeat(cut, size)[:n]


@dataclass
class Prices:
    """The Lagrangian prices (module docstring), each block an array the ascent moves."""

    lam: np.ndarray  # [N] slots at boundary b (just before access b), >= 0
    mu: np.ndarray  # [N] the GPU side's share of access tau's duration, in [0, 1]
    rho: np.ndarray  # [N] prefix copy-engine rows, >= 0, sum <= 1
    sigma: np.ndarray  # dyadic interval copy-engine rows (``_levels``), >= 0, with P + S <= 1
    kappa: np.ndarray  # [J] launch rows y_tau >= g_j, >= 0
    pi: np.ndarray  # [J] batch rows z_tau >= 1 - g_j, >= 0

    def blocks(self) -> tuple[np.ndarray, ...]:
        return self.lam, self.mu, self.rho, self.sigma, self.kappa, self.pi

    def project(self) -> None:
        """Back into the feasible set (in place): any feasible prices give a valid bound."""
        np.maximum(self.lam, 0.0, out=self.lam)
        np.clip(self.mu, 0.0, 1.0, out=self.mu)
        self.rho[:] = _project_rho(self.rho)
        np.maximum(self.sigma, 0.0, out=self.sigma)
        _repair(self.sigma, suffix_sums(self.rho))
        np.maximum(self.kappa, 0.0, out=self.kappa)
        np.maximum(self.pi, 0.0, out=self.pi)


def start_prices(pb: _Problem, rho0: float) -> Prices:
    """Half the weight on each engine, ``rho0`` on the whole-trace copy row, no slot price; a quarter of each
    launch and batch spread over the access's requests."""
    n = pb.N
    rho = np.zeros(n)
    rho[-1] = rho0
    per_access = np.maximum(np.bincount(pb.access, minlength=n), 1)[pb.access]
    return Prices(np.zeros(n), np.full(n, 0.5), rho, np.zeros(interval_count(n)),
                  0.25 * pb.gfix / per_access, 0.25 * pb.cfix / per_access)


def dual_value(pb: _Problem, pr: Prices) -> tuple[float, tuple[np.ndarray, ...]]:
    """``(L in microseconds, subgradients in the order of Prices.blocks)`` at feasible prices ``pr``."""
    mu = pr.mu
    P = suffix_sums(pr.rho)
    S = _per_access(pr.sigma, pb.N)
    w = 1.0 - P - S
    gcost = (w * mu)[pb.access] * pb.gt + pr.kappa
    ccost = (w * (1.0 - mu))[pb.access] * pb.ct + pr.pi
    lam_prefix = np.r_[0.0, np.cumsum(pr.lam)]
    land_base = pb.cs * (P + S) - lam_prefix[1:]
    total, kept, landing, gpu = _chains(pb.order, pb.starts, pb.access, gcost, ccost, land_base,
                                    lam_prefix)
    # launch y and batch z per access: paid where their coefficient is negative
    coef_y = w * mu * pb.gfix - np.bincount(pb.access, weights=pr.kappa, minlength=pb.N)
    coef_z = w * (1.0 - mu) * pb.cfix - np.bincount(pb.access, weights=pr.pi, minlength=pb.N)
    y, z = (coef_y < 0).astype(float), (coef_z < 0).astype(float)
    G = np.bincount(pb.access[gpu], weights=pb.gt[gpu], minlength=pb.N)
    cpu = ~gpu
    C = np.bincount(pb.access[cpu], weights=pb.ct[cpu], minlength=pb.N)
    X = pb.ne + mu * (pb.gfix * y + G) + (1.0 - mu) * (pb.cfix * z + C)  # the mu-weighted duration
    value = float(np.dot(w, pb.ne) + total + np.minimum(coef_y, 0).sum() + np.minimum(coef_z, 0).sum()
                  - pb.slots * pr.lam.sum() - pb.cs * pr.sigma.sum())
    # slots: a kept request holds boundaries prev_access + 1 .. access, a copy landing at s those s + 1 .. access
    copied = landing >= 0
    held_from = np.concatenate((pb.prev_access[kept], landing[copied])) + 1
    held_to = np.concatenate((pb.access[kept], pb.access[copied])) + 1
    diff = np.bincount(held_from, minlength=pb.N + 1) - np.bincount(held_to, minlength=pb.N + 1)
    g_lam = np.cumsum(diff)[:pb.N] - pb.slots
    g_mu = w * (pb.gfix * y + G - pb.cfix * z - C)
    lands = np.bincount(landing[copied], minlength=pb.N) * pb.cs
    g_rho = np.cumsum(lands) - np.cumsum(X)
    g_sigma = _per_interval(lands - X) - pb.cs
    g_kappa = gpu - y[pb.access]
    g_pi = cpu - z[pb.access]
    return value, (g_lam, g_mu, g_rho, g_sigma, g_kappa, g_pi)


def _project_rho(rho: np.ndarray) -> np.ndarray:
    """Onto ``{rho >= 0, sum rho <= 1}``."""
    rho = np.maximum(rho, 0.0)
    if rho.sum() <= 1.0:
        return rho
    u = np.sort(rho)[::-1]  # Euclidean projection onto the simplex (sorting method)
    css = np.cumsum(u) - 1.0
    k = np.flatnonzero(u - css / np.arange(1, u.size + 1) > 0)[-1]
    return np.maximum(rho - css[k] / (k + 1), 0.0)


def _ascend(pb: _Problem, rho0: float, iterations: int) -> tuple[float, list[float]]:
    """Best dual value (microseconds) of one ascent from ``start_prices(pb, rho0)``, and each step's value."""
    pr = start_prices(pb, rho0)
    best, history, scale = -np.inf, [], 1.0
    for _ in range(iterations):
        value, grads = dual_value(pb, pr)
        history.append(value / US)
        if value > best:
            best = value
        else:
            scale *= DECAY  # no progress: shorter steps
        goal = best * 1.05 + 1e-9  # aim 5% above the best so far (a target above the optimum oscillated more)
        blocks = pr.blocks()
        for x, g in zip(blocks, grads):  # Polyak's step towards the goal, per block of prices
            nrm = float(np.dot(g, g))
            if nrm > 0:
                x += scale * (goal - value) / nrm * g / len(blocks)
        pr.project()
    return best, history


def dual_bound_counts(counts: np.ndarray, timed: np.ndarray, cm: CostModel, total_slots: int,
                      iterations: int = DEFAULT_ITERATIONS) -> DualBoundResult:
    """The bound over token counts ``[L, F, E]`` and a timed-forward mask ``[F]`` (see :func:`dual_bound`)."""
    if total_slots < 1:
        raise ValueError(f"total_slots={total_slots} must be >= 1")
    if iterations < 1:
        raise ValueError(f"iterations={iterations} must be >= 1")
    t0 = time.perf_counter()
    pb = _problem(counts, timed, cm, total_slots)
    full = full_time(counts, timed, cm)
    if pb.N == 0:
        return DualBoundResult(0.0, full, 0, 0.0)
    runs = [_ascend(pb, rho0, iterations) for rho0 in STARTS]
    best, history = max(runs, key=lambda r: r[0])
    return DualBoundResult(best / US, full, iterations * len(STARTS), time.perf_counter() - t0, history)


def dual_bound(trace: Trace, cm: CostModel, total_slots: int, warmup_sequences: int = 0,
               iterations: int = DEFAULT_ITERATIONS) -> DualBoundResult:
    """The whole-trace bound at ``total_slots`` GPU expert slots (all layers), over the timed forwards."""
    return dual_bound_counts(request_counts(trace), timed_forwards(trace, warmup_sequences), cm, total_slots,
                             iterations)
