"""The valid lower bound: a linear-programming relaxation of offline caching with bypass, timed.

Why: ``physical.py``'s MIN bound lets a CPU-served miss enter the cache without a copy and counts
misses, not time; it is loose by about 2x. This bound charges every expert that enters the GPU
cache a copy, runs the copy engine, the GPU and the CPU in parallel as the replay timeline does
(``sim/timeline.py``), and minimises time. It bounds every schedule of every system replay times
(any retention, prefetch, dispatch, and any split of the slot budget across layers, fixed or
changing), at ``total_slots`` slots over all layers.

Model, over the timed layer accesses tau = 0..N-1 in trace order (layers 0..L-1 of a forward, then
the next forward); one request j per (access, requested expert) with ``n_j`` tokens:

* ``g_j``: served on the GPU (else on the CPU); ``kin_j``: kept resident from the item's previous
  request (or from the window's start) up to j; ``c0_j``: demand copy issued during access tau_j;
  ``cm_j``: copy issued during the layer's previous access or after it (tau_j - L .. tau_j - 1);
  ``ce_j``: copy issued earlier and held. Resident at j: ``r_j = kin_j + c0_j + cm_j + ce_j <= 1``,
  ``g_j <= r_j``, and kept towards the next request: ``kin_next <= r_j``. All in [0, 1].
* Slots, two snapshots per access (before its copies, after its evictions): the items kept across
  tau (``kin`` of gaps spanning it, the initial cache, ``ce`` over the L accesses before its use)
  plus, before: tau's requests held in advance (``kin + cm + ce``), after: those kept
  (``kin_next``); each <= ``total_slots``. A demand copy evicted within its access (streaming
  through a slot) holds no slot in either snapshot, as replay allows.
* Per access duration ``M_tau`` (the timeline's start-to-end of the layer, layers in sequence):
  ``>= nonexpert + gpu_layer_fixed * y + sum g_j * gpu_time(n_j)`` (``y >= g_j``: the launch is paid
  once if any expert runs on the GPU), ``>= nonexpert + cpu_overhead * z + sum (1 - g_j) cpu_time(n_j)``
  (``z >= 1 - g_j``), ``>= nonexpert + copy_time * sum c0_j`` (demand copies start at the plan).
* The copy engine (one, serial): a copy lands before its access ends; ``c0`` starts within its
  access, ``cm`` within the L + 1 accesses ending at its use, ``ce`` any time in the window. Every
  interval [a, b] of accesses must hold the copies whose whole window lies inside it (Horn's
  condition for preemptive single-machine scheduling with release times and deadlines), written
  with prefix sums: ``sum_{<=b} copies <= sum_{<=b} M`` and, for the c0/cm copies, a suffix maximum
  (``W``) so every interval costs O(1) rows.

Objective: ``sum M_tau``. The trace is cut into windows of ``window_forwards`` forwards; each
window's LP starts from a free cache (any ``total_slots`` experts: what is resident or in flight,
its slot reserved, at the window's start), so the sum over windows is still a lower bound. Short
windows are loose where the cache holds a window's whole working set (the deep toy at 40%: 1.11x
fused with 2-forward windows, 1.68x over 32 forwards with 8-forward ones); longer windows cost
superlinear HiGHS time. A longer window is not always higher: a copy in flight across a window
start holds its slot in the split LP (initial cache) but not in the joint one (a ``cm`` copy holds
a slot only at its access's snapshot); both are valid.

Cost (HiGHS dual simplex on two busy cores): about 0.1 s per 2-forward window of the deep toy
(8 x 256), 3 s per 8-forward window, 30-50 s per 16-forward window; 2-7 s per 2-forward window
of the mini-like workload (19 x 256, ~110 experts per access).

What the relaxation drops (each makes the bound lower, never higher):

* integrality: fractional residency, copies and CPU/GPU splits (an expert half on each side);
* the planner's host time (0 here), the CPU's DRAM sharing with the copy engine (the CPU runs at
  its unshared rate), the GPU kernel of a copied expert after its copy lands (only the landing is
  before the access's end), and the non-expert part of the first timed access;
* slots held by a copy in flight before its snapshot, by ``cm`` copies before the access's own
  snapshot and by ``ce`` copies more than L accesses before their use, and by items resident but
  not kept until their next request; copies never used (wasted prefetches);
* ``ce`` copies may start anywhere in the window (their release after the previous request is
  dropped); the copy-engine intervals of ``ce`` copies beyond the cumulative one;
* the cost of filling the cache at each window's start (free initial cache).

It keeps what the timeline charges: the non-expert part before the plan (GPU experts, CPU batch and
demand copies all start after it), one GPU launch per access with GPU experts, one CPU batch
overhead per access with CPU experts, each CPU expert's roofline ``max(fixed, n x per-token)``, each
GPU expert's weight read and FLOPs, one copy per expert entering the cache, one copy engine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from oled_hf.offload.costmodel import CostModel

from ...offload.trace import Trace
from ..demand import full_time, request_counts, timed_forwards

if TYPE_CHECKING:
    import scipy.sparse as sp  # imported where used: scipy is in the eval extra, not a core dependency

US = 1e6  # the LP works in microseconds (better scaled than seconds)
DEFAULT_WINDOW = 64  # forwards per LP window
METHOD = "highs-ds"  # HiGHS dual simplex (scipy.optimize.linprog): faster than IPM on these windows
OPTIONS: dict = {}  # extra HiGHS options (e.g. {"disp": True})


@dataclass
class Requests:
    """The requests of one window: flat arrays, one entry per (access, requested expert)."""

    num_accesses: int
    num_layers: int
    access: np.ndarray  # [J] access index tau
    item: np.ndarray  # [J] layer * E + expert
    tokens: np.ndarray  # [J] tokens routed
    prev: np.ndarray  # [J] previous request of the same item in the window, -1 if none
    next: np.ndarray  # [J] next request of the same item, -1 if none
    num_items: int = 0  # L * E: the item index space (prices are indexed by item)


def window_requests(counts: np.ndarray, forwards: np.ndarray) -> Requests:
    """Requests of ``counts[:, forwards, :]`` (``[L, F, E]`` tokens) in access order."""
    L, _, E = counts.shape
    sub = counts[:, forwards, :].transpose(1, 0, 2).reshape(-1, E)  # [N = F_w * L, E], access-major
    acc, exp = np.nonzero(sub)
    item = (acc % L) * E + exp
    order = np.lexsort((acc, item))  # by item, then time
    prev = np.full(acc.size, -1, dtype=np.int64)
    nxt = np.full(acc.size, -1, dtype=np.int64)
    same = item[order][1:] == item[order][:-1]
    prev[order[1:][same]] = order[:-1][same]
    nxt[order[:-1][same]] = order[1:][same]
    return Requests(sub.shape[0], L, acc.astype(np.int64), item.astype(np.int64), sub[acc, exp].astype(np.float64),
                    prev, nxt, L * E)


@dataclass
class WindowSolution:
    """One window's LP: its value (seconds) and the fractional schedule (per request)."""

    time_s: float
    requests: Requests
    g: np.ndarray
    kin: np.ndarray
    copies: np.ndarray  # c0 + cm + ce
    solve_s: float
    status: str
    start_state: np.ndarray | None = None  # [items] residency at the window's start (priced windows only)
    end_state: np.ndarray | None = None  # [items] residency at its end (priced windows only)


class _Builder:
    """Sparse rows ``A x <= b`` / ``A x = b`` accumulated as COO triplets."""

    def __init__(self) -> None:
        self.r: list[np.ndarray] = []
        self.c: list[np.ndarray] = []
        self.v: list[np.ndarray] = []
        self.rhs: list[np.ndarray] = []
        self.n = 0

    def rows(self, count: int) -> np.ndarray:
        ids = np.arange(self.n, self.n + count)
        self.n += count
        return ids

    def add(self, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray | float) -> None:
        rows, cols = np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)
        self.r.append(rows)
        self.c.append(cols)
        self.v.append(np.broadcast_to(np.asarray(vals, dtype=np.float64), rows.shape).copy())

    def matrix(self, ncols: int) -> sp.csr_matrix:
        import scipy.sparse as sp

        if not self.r:
            return sp.csr_matrix((self.n, ncols))
        return sp.coo_matrix((np.concatenate(self.v), (np.concatenate(self.r), np.concatenate(self.c))),
                             shape=(self.n, ncols)).tocsr()


def solve_window(req: Requests, cm: CostModel, total_slots: int, first_nonexpert: bool = True,
                 price_in: np.ndarray | None = None, price_out: np.ndarray | None = None) -> WindowSolution:
    """The LP of one window (module docstring); ``first_nonexpert=False`` drops access 0's non-expert part.

    ``price_in`` / ``price_out`` (microseconds per item, >= 0, ``[req.num_items]``): the Lagrangian
    prices of ``sim/bounds/coupled.py``. Each unit of residency at the start costs ``price_in`` (the
    start state is then what has *landed*: a copy in flight at the start is a copy of this window,
    and the one copy the engine may be running at the start is granted as slack); each unit at the
    end earns ``price_out``: an item kept from its last request to the end, kept from the start
    through a window that does not request it, or copied to land by the end (on the copy engine,
    holding a slot in the last snapshot only).
    """
    N, L, J = req.num_accesses, req.num_layers, req.access.size
    priced = price_in is not None or price_out is not None
    pin = np.zeros(req.num_items) if price_in is None else np.asarray(price_in, dtype=np.float64)
    pout = np.zeros(req.num_items) if price_out is None else np.asarray(price_out, dtype=np.float64)
    for name, pr in (("price_in", pin), ("price_out", pout)):
        if pr.shape != (req.num_items,) or not np.isfinite(pr).all() or (pr < 0).any():
            raise ValueError(f"{name} must be finite and >= 0, one per item ({req.num_items}); got shape {pr.shape}")
    last_j = np.flatnonzero((req.next < 0) & (pout[req.item] > 0))
    requested = np.zeros(req.num_items, dtype=bool)
    requested[req.item] = True
    out_items = np.flatnonzero(pout > 0)
    idle_items = out_items[~requested[out_items]]  # earn at the end, not requested in this window
    tau = req.access
    has_prev = req.prev >= 0
    gap_start = np.where(has_prev, tau[np.maximum(req.prev, 0)], -1)  # access of the previous request
    early = tau - L > gap_start  # ce exists: its L-access holding interval starts after the previous request
    if J:
        early &= tau - L >= 0
    ne = np.full(N, cm.nonexpert_s_per_layer * US)
    if not first_nonexpert and N:
        ne[0] = 0.0
    gt = cm.gpu_times(req.tokens) * US
    ct = cm.cpu_times(req.tokens) * US
    cs = cm.copy_time() * US
    # variable layout
    o = {}
    pos = 0
    for name, size in (("g", J), ("kin", J), ("c0", J), ("cm", J), ("ce", int(early.sum())), ("M", N), ("y", N),
                       ("z", N), ("A", N), ("P", N), ("Q0", N), ("QM", N), ("QE", N), ("W", N),
                       ("kend", last_j.size), ("x", idle_items.size), ("p", out_items.size)):
        o[name] = np.arange(pos, pos + size)
        pos += size
    nvar = pos
    ce_of = np.full(J, -1, dtype=np.int64)
    ce_of[early] = o["ce"]
    jj = np.arange(J)
    ub, lb = ub_lb(nvar, o)
    ineq, eq = _Builder(), _Builder()
    b_ineq: list[np.ndarray] = []
    b_eq: list[np.ndarray] = []

    def r_terms(rows: np.ndarray, sel: np.ndarray, sign: float) -> None:
        """Add sign * r_j (kin + c0 + cm + ce) of requests ``sel`` to ``rows``."""
        for name in ("kin", "c0", "cm"):
            ineq.add(rows, o[name][sel], sign)
        e = sel[early[sel]]
        ineq.add(rows[early[sel]], ce_of[e], sign)

    # R1: g - r <= 0
    rows = ineq.rows(J)
    ineq.add(rows, o["g"], 1.0)
    r_terms(rows, jj, -1.0)
    b_ineq.append(np.zeros(J))
    # R2: kin_next - r <= 0
    sel = jj[req.next >= 0]
    rows = ineq.rows(sel.size)
    ineq.add(rows, o["kin"][req.next[sel]], 1.0)
    r_terms(rows, sel, -1.0)
    b_ineq.append(np.zeros(sel.size))
    # R3: r <= 1
    rows = ineq.rows(J)
    r_terms(rows, jj, 1.0)
    b_ineq.append(np.ones(J))
    # R4: g - y <= 0 ; R5: -g - z <= -1
    rows = ineq.rows(J)
    ineq.add(rows, o["g"], 1.0)
    ineq.add(rows, o["y"][tau], -1.0)
    b_ineq.append(np.zeros(J))
    rows = ineq.rows(J)
    ineq.add(rows, o["g"], -1.0)
    ineq.add(rows, o["z"][tau], -1.0)
    b_ineq.append(-np.ones(J))
    # A1: sum gt g + Fg y - M <= -ne
    rows = ineq.rows(N)
    ineq.add(rows[tau], o["g"], gt)
    ineq.add(rows, o["y"], cm.gpu_layer_fixed_s * US)
    ineq.add(rows, o["M"], -1.0)
    b_ineq.append(-ne)
    # A2: Fc z - sum ct g - M <= -ne - sum ct
    rows = ineq.rows(N)
    ineq.add(rows[tau], o["g"], -ct)
    ineq.add(rows, o["z"], cm.cpu_overhead_s * US)
    ineq.add(rows, o["M"], -1.0)
    b_ineq.append(-ne - np.bincount(tau, weights=ct, minlength=N))
    # A3: cs sum c0 - M <= -ne
    rows = ineq.rows(N)
    ineq.add(rows[tau], o["c0"], cs)
    ineq.add(rows, o["M"], -1.0)
    b_ineq.append(-ne)
    # capacity before: A + sum (kin + cm + ce) <= S ; after: A + sum kin_next <= S
    rows = before = ineq.rows(N)
    ineq.add(rows, o["A"], 1.0)
    ineq.add(rows[tau], o["kin"], 1.0)
    ineq.add(rows[tau], o["cm"], 1.0)
    ineq.add(rows[tau[early]], o["ce"], 1.0)
    b_ineq.append(np.full(N, float(total_slots)))
    rows = after = ineq.rows(N)
    ineq.add(rows, o["A"], 1.0)
    ineq.add(rows[tau[sel]], o["kin"][req.next[sel]], 1.0)
    b_ineq.append(np.full(N, float(total_slots)))
    # A recurrence: A_t - A_{t-1} - starts_t + ends_t = 0 (holding intervals [s, e), counted at s..e-1)
    rows = eq.rows(N)
    eq.add(rows, o["A"], 1.0)
    eq.add(rows[1:], o["A"][:-1], -1.0)
    s_kin = np.where(has_prev, gap_start + 1, 0)  # kin of j held over [s_kin, tau_j)
    span = s_kin < tau
    eq.add(rows[s_kin[span]], o["kin"][span], -1.0)
    eq.add(rows[tau[span]], o["kin"][span], 1.0)
    s_ce = tau[early] - L
    eq.add(rows[s_ce], o["ce"], -1.0)
    eq.add(rows[tau[early]], o["ce"], 1.0)
    if priced:  # kept to the end: from the last request on; an idle item all window
        t_end = tau[last_j]
        held = t_end + 1 < N
        eq.add(rows[t_end[held] + 1], o["kend"][held], -1.0)
        eq.add(np.zeros(idle_items.size, dtype=np.int64) + rows[0], o["x"], -1.0)
    b_eq.append(np.zeros(N))
    # prefix sums: P_t = P_{t-1} + M_t ; Q*_t = Q*_{t-1} + cs * sum c*
    for name, var, sel_j in (("P", "M", None), ("Q0", "c0", jj), ("QM", "cm", jj), ("QE", "ce", jj[early])):
        rows = eq.rows(N)
        eq.add(rows, o[name], 1.0)
        eq.add(rows[1:], o[name][:-1], -1.0)
        if sel_j is None:
            eq.add(rows, o[var], -1.0)
        else:
            eq.add(rows[tau[sel_j]], o[var], -cs)
        b_eq.append(np.zeros(N))
    # cumulative copy engine: Q0 + QM + QE - P <= 0 (+ cs: the copy running at a landed-state start)
    rows = ineq.rows(N)
    for name, sign in (("Q0", 1.0), ("QM", 1.0), ("QE", 1.0), ("P", -1.0)):
        ineq.add(rows, o[name], sign)
    b_ineq.append(np.full(N, cs if price_in is not None else 0.0))
    if priced:
        _end_state_rows(req, o, ineq, b_ineq, r_terms, cs, last_j, idle_items, out_items, (before, after), rows)
    # Horn, c0 + cm: W_b >= Q0_b + QM_b - P_b ; W_b >= W_{b+1} ; W_{a+L} <= Q0_{a-1} + QM_{a+L-1} - P_{a-1}
    rows = ineq.rows(N)
    for name, sign in (("Q0", 1.0), ("QM", 1.0), ("P", -1.0), ("W", -1.0)):
        ineq.add(rows, o[name], sign)
    b_ineq.append(np.zeros(N))
    rows = ineq.rows(max(N - 1, 0))
    ineq.add(rows, o["W"][1:], 1.0)
    ineq.add(rows, o["W"][:-1], -1.0)
    b_ineq.append(np.zeros(max(N - 1, 0)))
    a = np.arange(1, max(N - L, 1))
    rows = ineq.rows(a.size)
    ineq.add(rows, o["W"][a + L], 1.0)
    ineq.add(rows, o["Q0"][a - 1], -1.0)
    ineq.add(rows, o["QM"][a + L - 1], -1.0)
    ineq.add(rows, o["P"][a - 1], 1.0)
    b_ineq.append(np.zeros(a.size))
    cost = np.zeros(nvar)
    cost[o["M"]] = 1.0
    if priced:
        first = jj[~has_prev]
        cost[o["kin"][first]] += pin[req.item[first]]
        cost[o["x"]] += pin[idle_items] - pout[idle_items]
        cost[o["kend"]] -= pout[req.item[last_j]]
        cost[o["p"]] -= pout[out_items]
    from scipy.optimize import linprog

    t0 = time.perf_counter()
    bu, be = np.concatenate(b_ineq), np.concatenate(b_eq)
    res = linprog(cost, A_ub=ineq.matrix(nvar), b_ub=bu, A_eq=eq.matrix(nvar), b_eq=be,
                  bounds=np.stack([lb, ub], axis=1), method=METHOD, options=OPTIONS)
    solve_s = time.perf_counter() - t0
    if res.status != 0:
        raise RuntimeError(f"LP bound: HiGHS did not solve a window of {N} accesses: {res.message}")
    x = res.x
    copies = x[o["c0"]] + x[o["cm"]]
    copies[early] += x[o["ce"]]
    start = end = None
    if priced:
        first = jj[~has_prev]
        start = np.zeros(req.num_items)
        start[req.item[first]] = x[o["kin"]][first]
        start[idle_items] = x[o["x"]]
        end = np.zeros(req.num_items)
        end[out_items] = x[o["p"]]
        end[req.item[last_j]] += x[o["kend"]]
        end[idle_items] += x[o["x"]]
    return WindowSolution(float(res.fun) / US, req, x[o["g"]], x[o["kin"]], copies, solve_s, res.message, start, end)


def _end_state_rows(req: Requests, o: dict[str, np.ndarray], ineq: _Builder, b_ineq: list[np.ndarray], r_terms,
                    cs: float, last_j: np.ndarray, idle_items: np.ndarray, out_items: np.ndarray,
                    snapshots: tuple[np.ndarray, np.ndarray], cum: np.ndarray) -> None:
    """A priced window's end state (``solve_window``'s docstring), added to ``ineq`` in place.

    ``kend_j <= r_j`` (kept from its last request j); per item ``kend + p <= 1`` (``x + p <= 1`` if not
    requested); ``kend`` counts in the snapshots after its request (the A recurrence holds it
    later); ``p`` in both snapshots of the last access (a copy is issued at a plan, its victim is
    not an expert that access requests: one issued earlier holds its slot through the last access,
    one issued at the last plan beside that access's resident experts); ``p`` copies land by the
    end (the last cumulative copy-engine row).
    """
    N = req.num_accesses
    before, after = snapshots
    pos = np.full(req.num_items, -1, dtype=np.int64)
    pos[out_items] = np.arange(out_items.size)
    rows = ineq.rows(last_j.size)
    ineq.add(rows, o["kend"], 1.0)
    r_terms(rows, last_j, -1.0)
    b_ineq.append(np.zeros(last_j.size))
    rows = ineq.rows(out_items.size)
    ineq.add(rows, o["p"], 1.0)
    ineq.add(rows[pos[req.item[last_j]]], o["kend"], 1.0)
    ineq.add(rows[pos[idle_items]], o["x"], 1.0)
    b_ineq.append(np.ones(out_items.size))
    ineq.add(after[req.access[last_j]], o["kend"], 1.0)
    ineq.add(np.full(out_items.size, after[N - 1]), o["p"], 1.0)
    ineq.add(np.full(out_items.size, before[N - 1]), o["p"], 1.0)
    ineq.add(np.full(out_items.size, cum[N - 1]), o["p"], cs)


def ub_lb(nvar: int, o: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Bounds: schedule variables in [0, 1], durations and prefix sums >= 0, A and W free."""
    ub = np.full(nvar, np.inf)
    lb = np.zeros(nvar)
    for name in ("g", "kin", "c0", "cm", "ce", "y", "z"):
        ub[o[name]] = 1.0
    for name in ("W",):
        lb[o[name]] = -np.inf
    return ub, lb


@dataclass
class LPBoundResult:
    """The LP bound over the timed forwards, the fused-resident time over them, and how it was solved."""

    time_s: float
    full_time_s: float
    windows: list[WindowSolution] = field(default_factory=list)
    window_forwards: int = DEFAULT_WINDOW

    @property
    def ratio_to_full(self) -> float:
        return self.time_s / self.full_time_s if self.full_time_s > 0 else float("nan")

    @property
    def solve_s(self) -> float:
        return sum(w.solve_s for w in self.windows)


def lp_bound(trace: Trace, cm: CostModel, total_slots: int, warmup_sequences: int = 0,
             window_forwards: int = DEFAULT_WINDOW) -> LPBoundResult:
    """The bound at ``total_slots`` GPU expert slots (all layers), over the timed forwards."""
    if total_slots < 1:
        raise ValueError(f"total_slots={total_slots} must be >= 1")
    if window_forwards < 1:
        raise ValueError(f"window_forwards={window_forwards} must be >= 1")
    counts = request_counts(trace)
    timed = timed_forwards(trace, warmup_sequences)
    return lp_bound_counts(counts, timed, cm, total_slots, window_forwards)


def lp_bound_counts(counts: np.ndarray, timed: np.ndarray, cm: CostModel, total_slots: int,
                    window_forwards: int = DEFAULT_WINDOW) -> LPBoundResult:
    """:func:`lp_bound` over token counts ``[L, F, E]`` and a timed-forward mask ``[F]``."""
    fw = np.flatnonzero(timed)
    windows = []
    for k, start in enumerate(range(0, fw.size, window_forwards)):
        req = window_requests(counts, fw[start:start + window_forwards])
        windows.append(solve_window(req, cm, total_slots, first_nonexpert=k > 0))
    return LPBoundResult(sum(w.time_s for w in windows), full_time(counts, timed, cm), windows, window_forwards)
