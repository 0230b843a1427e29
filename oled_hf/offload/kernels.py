"""The policy and planner math of the offload hot path, written once: OLED's update, the planner, the reuse rule.

These functions are the only implementation of those rules; the classes around them
(``planner.CacheState``, ``policies.oled.OledPolicy``) hold the state arrays and pack arguments.
The layer allocator's two kernels (the antitonic fit, the stack-distance fold) are ``jit``-ed the
same way in ``allocation.py``: they call no kernel, so the one-file rule below does not bind them.
Why kernels: at LLaDA2.0-mini scale a layer access was ~60-80 small NumPy calls of 1-3 us each,
so the host time was call dispatch, not arithmetic. Here a whole access is two calls:
``oled_update`` (the policy) and ``plan_access`` (hits, the copy-vs-CPU split, slots and victims,
streaming, reuse copies); each compiled call costs about 0.15 us per argument to enter, which is
why the planner passes packed tables.

Compiled or not, the same source runs. ``jit`` compiles a function with numba (a required
dependency; cached on disk) and otherwise returns the function itself, which then runs as plain
Python on NumPy scalars: with ``OLED_HF_KERNELS=numpy`` or ``NUMBA_DISABLE_JIT=1`` in the
environment, or where numba cannot be imported. That path is ~100x slower and is there for
debugging (breakpoints, prints) and for machines without numba; ``COMPILED`` says which runs. Both
perform the same IEEE operations in the same order (float32 stays float32, a division by zero gives
inf or NaN as NumPy's does: ``error_model="numpy"``), so decisions and the plan checksums do not
depend on which ran; ``tests/offload/test_kernels.py`` runs both on random cases.

The floating-point contract is the NumPy reference's that these kernels replaced, so the plan
checksums pinned on it still hold: per-expert sums are sequential in route order (``np.bincount``),
a row's or a batch's total is NumPy's pairwise sum (``_pairwise``), orders are stable with ties by
expert id, casts truncate. Transcendentals are libm's (``math.log1p``/``math.expm1``, ``np.sqrt``
is exact), compiled or not: not NumPy's SIMD versions, which on AVX-512 builds may differ from
libm in the last bit of a reuse prediction.

One file, past the ~400-line guideline, on purpose: numba's on-disk cache invalidates a function
when its own file changes, not when a kernel it calls in another file does, and these kernels call
each other (``plan_access`` -> ``split_misses`` -> ``_pairwise``, ``oled_update`` -> ``_measure``
-> ``stability``, the reuse rule from both the planner and the policy): split across files, an
edit to a callee would leave callers running its old code from the cache.
"""

from __future__ import annotations

import math
import os

import numpy as np

try:  # required (pyproject); the import may fail only on a platform numba does not support
    import numba
except ImportError:  # pragma: no cover - exercised where numba is missing
    numba = None

COMPILED = (numba is not None and not numba.config.DISABLE_JIT
            and os.environ.get("OLED_HF_KERNELS", "numba") != "numpy")
MAX_REUSE = 32.0  # cap of a predicted reuse (policies.base re-exports it)


def jit(fn):
    """``fn`` compiled by numba (nogil, cached on disk) where ``COMPILED``, else ``fn`` itself."""
    if not COMPILED:
        return fn
    return numba.njit(cache=True, nogil=True, error_model="numpy")(fn)


# ---------------------------------------------------------------------------------------------- sums
@jit
def _pairwise_block(a, lo, n):
    """NumPy's sum of ``a[lo:lo + n]`` for 1 <= n <= 128: eight interleaved partial sums combined as a
    tree, then the remainder in order (below 8 terms: in order). float32 stays float32, as in NumPy."""
    if n < 8:
        res = a[lo]
        for i in range(lo + 1, lo + n):
            res += a[i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = lo + 8
    while i < lo + n - (n % 8):
        r0 += a[i]
        r1 += a[i + 1]
        r2 += a[i + 2]
        r3 += a[i + 3]
        r4 += a[i + 4]
        r5 += a[i + 5]
        r6 += a[i + 6]
        r7 += a[i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < lo + n:
        res += a[i]
        i += 1
    return res


@jit
def _pairwise(a, n):
    """NumPy's pairwise sum of ``a[:n]`` (``np.add.reduce``), n >= 1, in ``a``'s dtype.

    Beyond 128 terms NumPy splits a run in two at a multiple of 8 near its middle and adds the two
    sums, recursively; here that recursion runs on an explicit stack (numba cannot load a cached
    recursive function). Frame states: 0 new, 1 waiting for its left half, 2 for its right half.
    """
    if n <= 128:
        return _pairwise_block(a, 0, n)
    los, ns, st = np.empty(64, dtype=np.int64), np.empty(64, dtype=np.int64), np.empty(64, dtype=np.int64)
    left = a[:64].copy()  # the left sums of the open frames, in a's dtype
    los[0], ns[0], st[0] = 0, n, 0
    d = 0
    res = a[0]
    while True:
        if st[d] == 0 and ns[d] <= 128:
            res = _pairwise_block(a, los[d], ns[d])
            d -= 1
        elif st[d] == 2:
            res = left[d] + res
            d -= 1
        else:
            half = ns[d] // 2
            half -= half % 8
            if st[d] == 1:
                left[d] = res
            lo, size = (los[d], half) if st[d] == 0 else (los[d] + half, ns[d] - half)
            st[d] += 1
            d += 1
            los[d], ns[d], st[d] = lo, size, 0
            continue
        if d < 0:
            return res


@jit
def _decay_add(score, decay, acc):
    """``score *= decay; score += acc``: two passes, so each product is rounded before the add."""
    for e in range(score.shape[0]):
        score[e] = score[e] * decay
    for e in range(score.shape[0]):
        score[e] = score[e] + acc[e]


@jit
def _class_sum(flat, entry_cls, per_class, out):
    """``bincount(flat, weights=per_class[entry_cls])`` into ``out``: sequential, in route order."""
    out[:] = 0.0
    for i in range(flat.shape[0]):
        out[flat[i]] += per_class[entry_cls[i]]


# ---------------------------------------------------------------------------------------------- OLED's update
@jit
def _score_update_gated(ids, gates, cls, stab, power, score, decay, acc):
    """OLED's priority update with gate weights (its rule 3). ``acc`` is scratch of the experts' length.

    Per row: g = gate ** power in float32 (``np.sqrt`` for 0.5, the gate itself for 1),
    entry = g * (s_row / max(pairwise sum of g, 1e-12)) in float64; then
    ``score = score * decay + (entries summed per expert in route order)``.
    """
    rows, k = ids.shape
    g = np.empty(k, dtype=np.float32)
    p = np.float32(power)
    acc[:] = 0.0
    tiny = np.float32(1e-12)
    for r in range(rows):
        for j in range(k):
            x = gates[r, j]
            if power == 0.5:
                g[j] = np.sqrt(x)
            elif power == 1.0:
                g[j] = x
            else:
                g[j] = x ** p
        total = _pairwise(g, k)
        if total < tiny:
            total = tiny
        fac = stab[cls[r]] / np.float64(total)
        for j in range(k):
            acc[ids[r, j]] += np.float64(g[j]) * fac
    _decay_add(score, decay, acc)


@jit
def _score_update_flat(ids, entry_cls, stab, score, decay, acc):
    """The update without gate weights (none given, or gate power 0): every route counts ``s_row / k``."""
    rows, k = ids.shape
    acc[:] = 0.0
    i = 0
    for r in range(rows):
        for j in range(k):
            acc[ids[r, j]] += stab[entry_cls[i]] / k
            i += 1
    _decay_add(score, decay, acc)


@jit
def stability(pseudo, calib, min_stability, out):
    """OLED's calibrated stability per class (rule 2): ``(prior * rows + kept) / (rows + measured)``,
    clipped to ``[min_stability, 1]``; ``pseudo`` and ``calib`` are ``[2, classes]`` (numerators, denominators)."""
    for c in range(out.shape[0]):
        s = (pseudo[0, c] + calib[0, c]) / (pseudo[1, c] + calib[1, c])
        if s < min_stability:
            s = min_stability
        if s > 1.0:
            s = 1.0
        out[c] = s


@jit
def _measure(ids, prev_ids, prev_cls, prev_entry_cls, prev_counts, calib, calib_decay):
    """OLED's calibration step: route persistence from the previous forward of the block, in place.

    A previous route's matches are the current routes of its row to the same expert; a row's kept
    fraction is its matches / k, summed per class of the previous rows and added to the decayed
    calibration with the class's row count. For k a power of two every fraction and partial sum is
    exact, so matches are summed per class first and divided once; otherwise per row.
    """
    rows, k = ids.shape
    pow2 = k & (k - 1) == 0
    n_cls = calib.shape[1]
    kept = np.zeros(n_cls)
    i = 0
    for r in range(rows):
        row_sum = 0
        for j in range(k):
            e = prev_ids[r, j]
            m = 0
            for jj in range(k):
                if ids[r, jj] == e:
                    m += 1
            if pow2:
                kept[prev_entry_cls[i]] += np.float64(m)
            else:
                row_sum += m
            i += 1
        if not pow2:
            kept[prev_cls[r]] += row_sum / k
    if pow2:
        for c in range(n_cls):
            kept[c] = kept[c] / k
    for c in range(n_cls):
        calib[0, c] = calib[0, c] * calib_decay
        calib[1, c] = calib[1, c] * calib_decay
    for c in range(n_cls):
        calib[0, c] = calib[0, c] + kept[c]
        calib[1, c] = calib[1, c] + prev_counts[c]


@jit
def oled_update(ids, gates, power, cls, entry_cls, prev_ids, prev_cls, prev_entry_cls, prev_counts, measure_it,
                keep, calib, calib_decay, pseudo, min_stability, stab, score, decay, acc):
    """One OLED access in one call (``OledPolicy._update``): calibrate from the previous forward
    (``measure_it``) and refresh ``stab``, keep this access's ids in ``keep`` for the next one, then
    the score update (``power`` 0: no gate weights)."""
    if measure_it:
        _measure(ids, prev_ids, prev_cls, prev_entry_cls, prev_counts, calib, calib_decay)
        stability(pseudo, calib, min_stability, stab)
    keep[:, :] = ids
    if power == 0.0:
        _score_update_flat(ids, entry_cls, stab, score, decay, acc)
    else:
        _score_update_gated(ids, gates, cls, stab, power, score, decay, acc)


@jit
def classify(masked, confidence, committed, edited, has_edited, threshold, n_bins, codes, cls, counts):
    """OLED's stability class per row (its rule 1) and the class counts, in one pass.

    ``codes`` = (DECODED, COMMITTED, CONFIDENT, UNSURE, EDITED). Edited wins, then committed, then
    decoded (not masked); a masked row is confident at ``confidence >= threshold``, else unsure in
    bin ``int(conf / threshold * n_bins)`` (truncated) clipped to ``[0, n_bins - 1]``.
    """
    counts[:] = 0
    for i in range(cls.shape[0]):
        if has_edited and edited[i]:
            c = codes[4]
        elif committed[i]:
            c = codes[1]
        elif not masked[i]:
            c = codes[0]
        elif confidence[i] >= threshold:
            c = codes[2]
        else:
            b = np.int64(confidence[i] / threshold * n_bins)
            c = codes[3] + min(max(b, 0), n_bins - 1)
        cls[i] = c
        counts[c] += 1


# ---------------------------------------------------------------------------------------------- reuse
@jit
def _geometric(p):
    """Expected run of further uses of an expert used with probability ``p``: ``p / (1 - p)``, capped."""
    d = 1.0 - p
    r = p / (d if d > 1e-9 else 1e-9)
    return r if r < MAX_REUSE else MAX_REUSE


@jit
def geometric_reuse(u):
    """``_geometric`` of each use probability in ``u`` (the base policy's reuse), a new array."""
    out = np.empty(u.shape[0])
    for i in range(u.shape[0]):
        out[i] = _geometric(u[i])
    return out


@jit
def _log_miss(mode, flat, entry_cls, stab, num_experts):
    """OLED's per-expert sum of log(1 - s_row) over its routes, s capped at 0.99 (mode 2); empty otherwise."""
    if mode != 2:
        return np.empty(0)
    per_class = np.empty(stab.shape[0])
    for c in range(stab.shape[0]):
        s = stab[c]
        per_class[c] = math.log1p(-(s if s < 0.99 else 0.99))
    out = np.empty(num_experts)
    _class_sum(flat, entry_cls, per_class, out)
    return out


@jit
def _reuse_at(e, mode, reuse_row, log_miss):
    """Predicted reuse of expert ``e``: the policy's row (mode 1), or OLED's rule 4 from its log-miss:
    ``p = 1 - prod over routes (1 - s_row)``, the chance it is requested next iteration, then ``_geometric``."""
    if mode == 1:
        return reuse_row[e]
    return _geometric(-math.expm1(log_miss[e]))


@jit
def oled_reuse(flat, entry_cls, stab, num_experts, experts, out):
    """OLED's predicted reuse (rule 4) of ``experts`` into ``out``, from one access's routes and stability."""
    log_miss = _log_miss(2, flat, entry_cls, stab, num_experts)
    for i in range(experts.shape[0]):
        out[i] = _reuse_at(experts[i], 2, log_miss, log_miss)


# ---------------------------------------------------------------------------------------------- the planner
@jit
def lowest_idle(resident, counts, prio, n):
    """The ``n`` lowest-priority resident experts not requested now (``counts == 0``), ties by id.

    Kept as a sorted buffer of ``n`` while scanning the experts in id order (a strict comparison
    keeps the lower id first among equal priorities: a stable order).
    """
    out = np.empty(max(n, 0), dtype=np.int64)
    keys = np.empty(max(n, 0))
    size = 0
    for e in range(resident.shape[0]):
        if resident[e] and counts[e] == 0:
            p = prio[e]
            if size < n:
                j = size
                size += 1
            elif n > 0 and p < keys[n - 1]:
                j = n - 1
            else:
                continue
            while j > 0 and keys[j - 1] > p:
                keys[j] = keys[j - 1]
                out[j] = out[j - 1]
                j -= 1
            keys[j] = p
            out[j] = e
    return out[:size]


@jit
def split_misses(tokens, reuse, admitted, room, g0, copy_t, ov, cf, cs, gf, gs, take):
    """The dispatcher's copy-vs-CPU rule (``oled_hf.offload.dispatch``, steps 1-3); fills ``take``.

    Per miss of ``n`` tokens: CPU time ``max(cf, n * cs)``, GPU time ``gf + n * gs``, ``r1 = 1 +
    max(reuse, 0)`` (a NaN reuse counts as 0). Admitted misses rank by ``cpu * r1 / (gpu + copy_t)``,
    descending, stable (a NaN key ranks last); the copied prefix minimises ``max(C, G)``: ``C`` the
    CPU batch left (``ov`` once, plus the pairwise sum of all CPU times, minus the running sum of the
    copied ones; 0 when all are copied), ``G`` = ``g0`` plus, per copy, ``gpu + copy_t / r1`` (plain
    ``copy_t`` beyond ``room``). Ties go to the longer prefix; no copy if the best span exceeds
    ``max(c0, g0)``.
    """
    m = tokens.shape[0]
    cpu = np.empty(m)
    gpu = np.empty(m)
    r1 = np.empty(m)
    neg_key = np.empty(m)
    for i in range(m):
        n = np.float64(tokens[i])
        c = n * cs
        cpu[i] = c if c > cf else cf
        gpu[i] = gf + n * gs
        r = reuse[i]
        r1[i] = 1.0 + (r if r > 0.0 else 0.0)
        neg_key[i] = -(cpu[i] * r1[i] / (gpu[i] + copy_t))
        if np.isnan(neg_key[i]):
            neg_key[i] = np.inf
    take[:] = False
    n_cand = 0
    for i in range(m):
        if admitted[i]:
            n_cand += 1
    if n_cand == 0:
        return
    cand = np.empty(n_cand, dtype=np.int64)
    keys = np.empty(n_cand)
    n_cand = 0
    for i in range(m):
        if admitted[i]:
            cand[n_cand] = i
            keys[n_cand] = neg_key[i]
            n_cand += 1
    order = cand[np.argsort(keys, kind="mergesort")]
    if m == 1:
        c0 = ov + cpu[0]
    elif m == 2:
        c0 = ov + (cpu[0] + cpu[1])
    else:
        c0 = ov + _pairwise(cpu, m)
    best, best_span = 0, np.inf
    g_run = -0.0  # -0.0 + x == x: the first running sum is exactly its first term
    c_run = -0.0
    for j in range(n_cand):
        i = order[j]
        g_run += gpu[i] + (copy_t / r1[i] if j < room else copy_t)
        c_run += cpu[i]
        g_span = g0 + g_run
        c_span = c0 - c_run if j + 1 < m else 0.0  # all copied: no CPU batch
        span = c_span if c_span > g_span else g_span
        if span <= best_span:
            best, best_span = j + 1, span
    if best_span > (c0 if c0 > g0 else g0):
        best = 0
    for j in range(best):
        take[order[j]] = True


@jit
def apply_copies(flags, new, evicted, slots, slot_expert):
    """Residency after one access's copies (``new`` into ``slots``, in order), evicting ``evicted``.

    ``flags`` is the layer's ``[2, E]`` (resident, copied-and-not-hit-since). An evicted expert is
    dead on arrival if it was copied and never hit since, earlier or in this access (a copy that a
    later copy streamed through); a slot taken several times ends with its last expert. Returns
    how many were dead on arrival.
    """
    doa = 0
    for e in evicted:
        fresh = flags[1, e]
        for x in new:
            if x == e:
                fresh = True
        if fresh:
            doa += 1
    for e in new:
        flags[0, e] = True
        flags[1, e] = True
    for e in evicted:
        flags[0, e] = False
        flags[1, e] = False
    for i in range(new.shape[0]):
        slot_expert[slots[i]] = new[i]
    return doa


@jit
def _admit_by_priority(misses, take, resident, counts, prio, n_free):
    """Admission by prediction (the dispatch knob ``admission=priority``): of the misses the split would
    copy, those beyond the free slots take a victim only if they rank above it; the rest stay on the CPU.

    The highest-ranked copies take the free slots; then the j-th next-highest copy is compared with the
    j-th lowest-ranked idle resident (the planner's victim order), and the first that does not outrank its
    victim ends the admissions. Ties keep the resident (a copy must earn its slot).
    """
    nt = 0
    for i in range(misses.shape[0]):
        if take[i]:
            nt += 1
    need = nt - n_free
    if need <= 0:
        return
    cand = np.empty(nt, dtype=np.int64)
    keys = np.empty(nt)
    j = 0
    for i in range(misses.shape[0]):
        if take[i]:
            cand[j] = i
            keys[j] = -prio[misses[i]]
            j += 1
    order = cand[np.argsort(keys, kind="mergesort")]  # best first, ties by id
    victims = lowest_idle(resident, counts, prio, need)
    n_ok = n_free
    for v in range(victims.shape[0]):
        if prio[misses[order[n_ok]]] > prio[victims[v]]:
            n_ok += 1
        else:
            break
    if victims.shape[0] < need and n_ok == n_free + victims.shape[0]:  # the request streams past the capacity
        n_ok = nt
    for j in range(n_ok, nt):
        take[order[j]] = False


@jit
def plan_access(layer, counts, flags_all, tables, free_n, slot_expert, prio, adm, use_adm, reuse_mode, reuse_row,
                flat, entry_cls, stab, capacity, total_tokens, cpu_enabled, bg_copies, bg_min_reuse, costs, out):
    """One access of ``CacheState.plan``, in place over the state arrays (the module rules of ``planner``).

    Hits and misses in id order; the dispatcher's split (``split_misses``, with the policy's
    reuse unless rule 4's reuse copies serve it off the critical path); copies in ascending
    priority (ties by id) into free slots (popped from the top of the layer's stack), then the
    lowest-priority idle residents, then the access's computed experts (a request over the capacity
    streams through their slots); then rule 4's reuse copies. ``out`` rows: hits, their slots,
    copied experts, their slots, their victims (-1 none), CPU experts, reuse copies, their slots,
    their victims, then (row 9) the counts: hits, misses, copies, CPU experts, CPU tokens, reuse
    copies, copies into free slots, reuse copies into free slots, dead on arrival, whether a copy
    streamed through a slot of this access. ``tables`` is ``[slot of each expert, free-slot stack]``
    per layer; ``costs`` the dispatcher's constants (``Dispatcher.kernel_costs``: copy time, CPU and GPU
    costs, then 1 for admission by priority, ``_admit_by_priority``); ``reuse_mode``
    1: ``reuse_row`` is the policy's reuse, 2: OLED's rule from ``flat``, ``entry_cls``, ``stab``.
    Few arguments: each costs ~0.15 us to pass.
    """
    flags = flags_all[layer]
    slot_of = tables[0, layer]
    free = tables[1, layer]
    copy_t, ov, cf, cs, gf, gs = costs[0], costs[1], costs[2], costs[3], costs[4], costs[5]
    E = counts.shape[0]
    nh = 0
    nm = 0
    misses = np.empty(E, dtype=np.int64)
    for e in range(E):
        if counts[e]:
            if flags[0, e]:
                out[0, nh] = e
                out[1, nh] = slot_of[e]
                nh += 1
            else:
                misses[nm] = e
                nm += 1
    take = np.ones(nm, dtype=np.bool_)
    log_miss = np.empty(0)
    if nm and cpu_enabled:
        tokens = np.empty(nm, dtype=np.int64)
        admitted = np.ones(nm, dtype=np.bool_)
        n_adm = nm
        miss_sum = 0
        for i in range(nm):
            tokens[i] = counts[misses[i]]
            miss_sum += tokens[i]
            if use_adm and not adm[misses[i]]:
                admitted[i] = False
                n_adm -= 1
        if n_adm == 0:
            take[:] = False
        else:
            reuse = np.zeros(nm)
            if not bg_copies:
                log_miss = _log_miss(reuse_mode, flat, entry_cls, stab, E)
                for i in range(nm):
                    reuse[i] = _reuse_at(misses[i], reuse_mode, reuse_row, log_miss)
            g0 = gf * nh + gs * np.float64(total_tokens - miss_sum)
            split_misses(tokens, reuse, admitted, capacity - nh, g0, copy_t, ov, cf, cs, gf, gs, take)
    if costs[6] != 0.0 and cpu_enabled and nm > 0:
        _admit_by_priority(misses[:nm], take, flags[0], counts, prio, free_n[layer])
    nc = 0
    for i in range(nm):
        if take[i]:
            nc += 1
    copies = np.empty(nc, dtype=np.int64)
    keys = np.empty(nc)
    nc = 0
    ncpu = 0
    cpu_tokens = 0
    for i in range(nm):
        if take[i]:
            copies[nc] = misses[i]
            keys[nc] = prio[misses[i]]
            nc += 1
        else:
            out[5, ncpu] = misses[i]
            cpu_tokens += counts[misses[i]]
            ncpu += 1
    copies = copies[np.argsort(keys, kind="mergesort")]  # ascending priority, ties by id
    n_free = free_n[layer]
    need = nc - n_free
    victims = np.empty(0, dtype=np.int64)
    if need > 0:
        victims = lowest_idle(flags[0], counts, prio, need)
    # ---- from here on the state changes
    for i in range(nh):
        flags[1, out[0, i]] = False
    nf = min(nc, n_free)
    slots = np.empty(nc, dtype=np.int64)
    evicted = np.empty(max(nc - nf, 0), dtype=np.int64)
    computed = np.empty(0, dtype=np.int64)  # the access's computed experts, once a copy streams (-1: gone)
    for i in range(nc):
        if i < nf:
            slots[i] = free[n_free - 1 - i]
        else:
            if i - nf < victims.shape[0]:
                v = victims[i - nf]
            else:  # the request exceeds the capacity: through the lowest (priority, id) computed expert's slot
                if computed.shape[0] == 0:
                    computed = np.empty(nh + nc, dtype=np.int64)
                    computed[:nh] = out[0, :nh]
                    computed[nh:nh + i] = copies[:i]
                    computed[nh + i:] = -1
                best = -1
                for j in range(computed.shape[0]):
                    x = computed[j]
                    if x >= 0 and (best < 0 or prio[x] < prio[computed[best]]
                                   or (prio[x] == prio[computed[best]] and x < computed[best])):
                        best = j
                v = computed[best]
                computed[best] = -1
            evicted[i - nf] = v
            slots[i] = slot_of[v]
            slot_of[v] = -1
            out[4, i] = v
        slot_of[copies[i]] = slots[i]
        out[2, i] = copies[i]
        out[3, i] = slots[i]
        if computed.shape[0]:
            computed[nh + i] = copies[i]
    free_n[layer] = n_free - nf
    doa = apply_copies(flags, copies, evicted, slots, slot_expert)
    nbg = 0
    nbg_free = 0
    if ncpu and bg_copies:
        if reuse_mode == 2 and log_miss.shape[0] == 0:
            log_miss = _log_miss(reuse_mode, flat, entry_cls, stab, E)
        ranked = np.empty(ncpu, dtype=np.int64)
        neg = np.empty(ncpu)
        nr = 0
        for i in range(ncpu):
            r = _reuse_at(out[5, i], reuse_mode, reuse_row, log_miss)
            if r >= bg_min_reuse:
                ranked[nr] = out[5, i]
                neg[nr] = -r
                nr += 1
        cand = ranked[:nr][np.argsort(neg[:nr], kind="mergesort")][:bg_copies]
        n_free = free_n[layer]
        bg_victims = np.empty(0, dtype=np.int64)
        if cand.shape[0] > n_free:
            bg_victims = lowest_idle(flags[0], counts, prio, cand.shape[0] - n_free)
        vi = 0
        for e in cand:
            if n_free:
                slot = free[n_free - 1]
                n_free -= 1
                out[8, nbg] = -1
                nbg_free += 1
            elif vi < bg_victims.shape[0] and prio[bg_victims[vi]] < prio[e]:
                v = bg_victims[vi]
                vi += 1
                slot = slot_of[v]
                slot_of[v] = -1
                out[8, nbg] = v
            else:
                break
            slot_of[e] = slot
            out[6, nbg] = e
            out[7, nbg] = slot
            nbg += 1
        free_n[layer] = n_free
        if nbg:
            doa += apply_copies(flags, out[6, :nbg].copy(), bg_victims[:vi], out[7, :nbg].copy(), slot_expert)
    info = out[9]
    info[0] = nh
    info[1] = nm
    info[2] = nc
    info[3] = ncpu
    info[4] = cpu_tokens
    info[5] = nbg
    info[6] = nf
    info[7] = nbg_free
    info[8] = doa
    info[9] = computed.shape[0] > 0  # a copy streamed through a slot of this access




_warm = False


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel once, on tiny inputs of the types used live.

    Called when a planner or an OLED policy is built, so the first forward of a live run does not
    pay the ~1-3 s of compilation (0.1-1 s to load it from the on-disk cache). Nothing to do where
    the kernels run as Python.
    """
    global _warm
    if _warm or not COMPILED:
        return
    i64, ip = np.int64, np.intp
    ids, cls, stab = np.zeros((1, 2), dtype=i64), np.zeros(1, dtype=ip), np.ones(10)
    for power in (0.0, 0.5):
        oled_update(ids, np.ones((1, 2), dtype=np.float32), power, cls, np.zeros(2, dtype=ip), ids, cls,
                    np.zeros(2, dtype=ip), np.zeros(10, dtype=i64), True, ids.copy(), np.zeros((2, 10)), 0.98,
                    np.ones((2, 10)), 0.05, np.empty(10), np.zeros(2), 0.5, np.zeros(2))
    stability(np.ones((2, 10)), np.zeros((2, 10)), 0.05, np.empty(10))
    no = np.zeros(1, dtype=bool)
    classify(no, np.zeros(1), no, no, False, 0.9, 4, np.arange(5, dtype=ip), np.empty(1, dtype=ip),
             np.zeros(10, dtype=i64))
    oled_reuse(ids.reshape(-1), np.zeros(2, dtype=ip), stab, 2, np.arange(2, dtype=i64), np.empty(2))
    geometric_reuse(np.zeros(2))
    flags = np.zeros((1, 2, 2), dtype=bool)
    lowest_idle(np.ones(2, dtype=bool), np.zeros(2, dtype=i64), np.zeros(2), 1)
    apply_copies(flags[0], np.zeros(1, dtype=i64), np.zeros(0, dtype=i64), np.zeros(1, dtype=i64), np.full(1, -1))
    for mode in (1, 2):  # one access of a 1-layer, 2-expert, 1-slot cache: a copy and a CPU miss
        tables = np.stack((np.full((1, 2), -1), np.zeros((1, 2), dtype=i64)))
        plan_access(0, np.ones(2, dtype=i64), np.zeros((1, 2, 2), dtype=bool), tables, np.ones(1, dtype=i64),
                    np.full(1, -1), np.zeros(2), np.ones(2, dtype=bool), False, mode, np.ones(2), ids.reshape(-1),
                    np.zeros(2, dtype=ip), stab, 1, 2, True, 1, 1.0, np.array([1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0]),
                    np.zeros((10, 10), dtype=i64))
    _warm = True
