"""Compiled host code of the offload hot path (numba, optional): OLED's update, the planner, the row classes.

Why: at LLaDA2.0-mini scale a layer access was ~60-80 small NumPy calls of 1-3 us each, so the
host time was call dispatch, not arithmetic. Here a whole access is two calls: ``oled_update``
(the policy) and ``plan_access`` (hits, the copy-vs-CPU split, slots and victims, streaming,
reuse copies, over ``CacheState``'s arrays); each compiled call costs about 0.15 us per argument
to enter, which is why the planner passes packed tables. Every kernel performs the same IEEE
operations in the same order as the Python/NumPy code it stands in for (``np.bincount``'s
sequential sums, NumPy's pairwise float32 row sums, stable orders with ties by expert id,
NumPy's float64 arithmetic and truncating casts), so decisions, counters and the plan checksums
do not depend on which path ran; ``tests/offload/test_kernels.py`` compares the two.

Transcendentals: ``plan_access`` evaluates OLED's reuse (``log1p``, ``expm1``) with libm, which is
what NumPy calls on AVX2 machines like the test machine (bit-identical there, tested); NumPy's
AVX-512 builds use their own versions, which can differ in the last bit, so there a reuse
prediction may differ by one ulp (a decision only at an exact tie; the checksums would show it).

All kernels live in this one file because numba's on-disk cache invalidates a function when its
own file changes, not when a kernel it calls in another file does. Without numba, or with
``OLED_HF_KERNELS=numpy`` in the environment, ``ENABLED`` is False and the Python code runs (it
stays the reference).
"""

from __future__ import annotations

import math
import os

import numpy as np

try:  # numba is an optional dependency (the ``fast`` extra)
    import numba
except ImportError:  # pragma: no cover - exercised where numba is missing
    numba = None

ENABLED = numba is not None and os.environ.get("OLED_HF_KERNELS", "numba") != "numpy"
MAX_ROW = 128  # routes per row the gated update handles (NumPy's pairwise sum recurses beyond)
MAX_REUSE = 32.0  # cap of a predicted reuse (policies.base re-exports it)


def jit(fn):
    """``fn`` compiled (numba, cached on disk) where the kernels are enabled, else None."""
    return numba.njit(cache=True, nogil=True)(fn) if ENABLED else None


def _pairwise(a, n):
    """NumPy's pairwise sum of ``a[:n]`` (``np.add.reduce``), 1 <= n <= 128, in ``a``'s dtype.

    Up to 128 terms NumPy adds eight interleaved partial sums, combines them as a tree and adds
    the remainder in order (below 8 terms: in order); longer rows split recursively, which top-k
    routing and a layer's few misses never need (``MAX_ROW``). The compiled arithmetic keeps
    float32 in float32, as NumPy does.
    """
    if n < 8:
        res = a[0]
        for i in range(1, n):
            res += a[i]
        return res
    r0, r1, r2, r3, r4, r5, r6, r7 = a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]
    i = 8
    while i < n - (n % 8):
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
    while i < n:
        res += a[i]
        i += 1
    return res


def _decay_add(score, decay, acc):
    """``score *= decay; score += acc``: two passes, so each product is rounded before the add."""
    for e in range(score.shape[0]):
        score[e] = score[e] * decay
    for e in range(score.shape[0]):
        score[e] = score[e] + acc[e]


def _score_update_gated(ids, gates, cls, stab, sqrt_gate, score, decay, acc):
    """OLED's priority update with gate weights (``OledPolicy._update``, gate power 0.5 or 1).

    Per row: g = gate ** power (float32), entry = g * (s_row / max(sum(g), 1e-12)); then
    ``score = score * decay + bincount(ids, entry)``. ``acc`` is scratch of the experts' length.
    """
    rows, k = ids.shape
    g = np.empty(k, dtype=np.float32)
    acc[:] = 0.0
    tiny = np.float32(1e-12)
    for r in range(rows):
        for j in range(k):
            g[j] = np.sqrt(gates[r, j]) if sqrt_gate else gates[r, j]
        total = _pairwise(g, k)
        if total < tiny:
            total = tiny
        fac = stab[cls[r]] / np.float64(total)
        for j in range(k):
            acc[ids[r, j]] += np.float64(g[j]) * fac
    _decay_add(score, decay, acc)


def _score_update_flat(ids, entry_cls, stab, score, decay, acc):
    """The update without gate weights: every route of a row counts ``s_row / k``."""
    rows, k = ids.shape
    acc[:] = 0.0
    i = 0
    for r in range(rows):
        for j in range(k):
            acc[ids[r, j]] += stab[entry_cls[i]] / k
            i += 1
    _decay_add(score, decay, acc)


def _measure(ids, prev_ids, prev_cls, prev_entry_cls, prev_counts, pow2, calib, calib_decay,
             pseudo, min_stability, stab_out):
    """OLED's calibration step (``OledPolicy._measure`` then ``stability``), in place.

    A previous route's matches are the current routes of its row with the same expert; their sum
    per class (divided by k) is the class's kept fraction, added to the decayed calibration.
    """
    rows, k = ids.shape
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
    for c in range(n_cls):
        s = (pseudo[0, c] + calib[0, c]) / (pseudo[1, c] + calib[1, c])
        if s < min_stability:
            s = min_stability
        if s > 1.0:
            s = 1.0
        stab_out[c] = s


def _oled_update(ids, gates, gate_mode, cls, entry_cls, prev_ids, prev_cls, prev_entry_cls, prev_counts,
                 measure_it, keep, calib, calib_decay, pseudo, min_stability, stab, score, decay, acc):
    """One OLED access in one call: calibrate from the previous forward (``measure_it``), keep
    this access's ids in ``keep`` for the next one, then the score update (``gate_mode``: 0 no
    gates, 1 sqrt of the gates, 2 the gates)."""
    rows, k = ids.shape
    if measure_it:
        measure(ids, prev_ids, prev_cls, prev_entry_cls, prev_counts, k & (k - 1) == 0, calib, calib_decay,
                pseudo, min_stability, stab)
    keep[:, :] = ids
    if gate_mode == 0:
        score_update_flat(ids, entry_cls, stab, score, decay, acc)
    else:
        score_update_gated(ids, gates, cls, stab, gate_mode == 1, score, decay, acc)


def _classify(masked, confidence, committed, edited, has_edited, threshold, n_bins, codes, cls, counts):
    """``OledPolicy.classify`` per row, and the class counts (``np.bincount``) in the same pass.

    ``codes`` = (DECODED, COMMITTED, CONFIDENT, UNSURE, EDITED). An unsure row's bin is
    ``int(conf / threshold * n_bins)`` clipped to ``[0, n_bins - 1]``: NumPy's float64 arithmetic
    and truncating cast, element by element.
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


def _class_sum(flat, entry_cls, per_class, out):
    """``bincount(flat, weights=per_class[entry_cls])`` into ``out`` (OLED's log-miss per expert)."""
    out[:] = 0.0
    for i in range(flat.shape[0]):
        out[flat[i]] += per_class[entry_cls[i]]


def _lowest_idle(resident, counts, prio, n):
    """The ``n`` lowest-priority resident experts not requested now (``counts == 0``), ties by id.

    The planner's eviction order: ``cand[argsort(prio[cand], kind="stable")][:n]`` with ``cand``
    the resident idle experts in id order, kept as a sorted buffer of ``n`` (a strict comparison
    keeps the lower id first among equal priorities, as the stable sort does).
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


def _split_misses(tokens, reuse, admitted, room, g0, copy_t, ov, cf, cs, gf, gs, take):
    """``Dispatcher._split_small`` (the copy-vs-CPU rule), operation for operation; fills ``take``.

    Returns False (``take`` untouched) where a key is NaN, which the caller hands to NumPy.
    """
    m = tokens.shape[0]
    cpu = np.empty(m)
    gpu = np.empty(m)
    r1 = np.empty(m)
    neg_key = np.empty(m)
    for i in range(m):
        n = np.float64(tokens[i])
        c = n * cs
        cpu[i] = c if c > cf else cf  # the batch overhead ``ov``: once, in c0
        gpu[i] = gf + n * gs
        r = reuse[i]
        r1[i] = 1.0 + (0.0 if 0.0 > r else r)
        neg_key[i] = -(cpu[i] * r1[i] / (gpu[i] + copy_t))
        if np.isnan(neg_key[i]):
            return False
    take[:] = False
    n_cand = 0
    for i in range(m):
        if admitted[i]:
            n_cand += 1
    if n_cand == 0:
        return True
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
    g_run = -0.0
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
    return True


def _apply_copies(flags, new, evicted, slots, slot_expert):
    """``CacheState._apply_copies``: residency after one access's copies (in order), streamed or not.

    ``flags`` is the layer's ``[2, E]`` (resident, copied-and-not-hit-since). An evicted expert is
    dead on arrival if it was copied and never hit since, earlier or in this access (a copy that
    a later copy streamed through). Returns how many were.
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


def _reuse_at(e, mode, reuse_row, log_miss):
    """Predicted reuse of expert ``e``: the policy's row (mode 1) or OLED's rule 4 from its log-miss."""
    if mode == 1:
        return reuse_row[e]
    p = -math.expm1(log_miss[e])  # OLED's _reuse_from, element-wise
    d = 1.0 - p
    r = p / (d if d > 1e-9 else 1e-9)
    return r if r < MAX_REUSE else MAX_REUSE


def _log_miss(mode, flat, entry_cls, stab, num_experts):
    """OLED's per-expert sum of log(1 - s_row) over its routes (mode 2); empty otherwise."""
    if mode != 2:
        return np.empty(0)
    per_class = np.empty(stab.shape[0])
    for c in range(stab.shape[0]):
        s = stab[c]
        per_class[c] = math.log1p(-(s if s < 0.99 else 0.99))
    out = np.empty(num_experts)
    _class_sum(flat, entry_cls, per_class, out)
    return out


def _plan_access(layer, counts, flags_all, tables, free_n, slot_expert, prio, adm, use_adm, reuse_mode, reuse_row,
                 flat, entry_cls, stab, capacity, total_tokens, cpu_enabled, bg_copies, bg_min_reuse, costs, out):
    """``CacheState.plan`` for one access in one call, over the state arrays; returns 0, or 1 untouched.

    Same rules and floats as the Python path: hits and misses in id order, the dispatcher's split
    (``_split_misses``; up to ``MAX_ROW`` misses), copies in ascending priority into free slots
    (popped from the top of the layer's stack), then the lowest-priority idle residents, then
    the access's computed experts (a request over the capacity streams through their slots), then
    rule 4's reuse copies. Returns 1 before changing anything where the Python path must plan the
    access instead: a NaN key, more than ``MAX_ROW`` misses to split or a zero copy time. ``out``
    rows: hits, their slots, copied experts, their slots, their victims (-1 none), CPU experts,
    reuse copies, their slots, their victims, then (row 9) the counts: hits, misses, copies, CPU
    experts, CPU tokens, reuse copies, copies into free slots, reuse copies into free slots, dead
    on arrival, whether a copy streamed through a slot of this access. ``tables`` is ``[slot of
    each expert, free-slot stack]`` per layer; ``costs`` the dispatcher's constants
    (``Dispatcher.kernel_costs``). Few arguments: each costs ~0.15 us to pass.
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
            if nm > MAX_ROW or not copy_t > 0.0:
                return 1
            reuse = np.zeros(nm)
            if not bg_copies:
                log_miss = _log_miss(reuse_mode, flat, entry_cls, stab, E)
                for i in range(nm):
                    reuse[i] = _reuse_at(misses[i], reuse_mode, reuse_row, log_miss)
            g0 = gf * nh + gs * np.float64(total_tokens - miss_sum)
            if not _split_misses(tokens, reuse, admitted, capacity - nh, g0, copy_t, ov, cf, cs, gf, gs, take):
                return 1
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
        victims = _lowest_idle(flags[0], counts, prio, need)
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
    doa = _apply_copies(flags, copies, evicted, slots, slot_expert)
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
            bg_victims = _lowest_idle(flags[0], counts, prio, cand.shape[0] - n_free)
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
            doa += _apply_copies(flags, out[6, :nbg].copy(), bg_victims[:vi], out[7, :nbg].copy(), slot_expert)
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
    return 0


if ENABLED:  # compiled first: the kernels below call them
    _pairwise = numba.njit(cache=True, nogil=True)(_pairwise)
    _decay_add = numba.njit(cache=True, nogil=True)(_decay_add)
    _class_sum = numba.njit(cache=True, nogil=True)(_class_sum)
    _lowest_idle = numba.njit(cache=True, nogil=True)(_lowest_idle)
    _split_misses = numba.njit(cache=True, nogil=True)(_split_misses)
    _apply_copies = numba.njit(cache=True, nogil=True)(_apply_copies)
    _reuse_at = numba.njit(cache=True, nogil=True)(_reuse_at)
    _log_miss = numba.njit(cache=True, nogil=True)(_log_miss)
score_update_gated = jit(_score_update_gated)
score_update_flat = jit(_score_update_flat)
measure = jit(_measure)
oled_update = jit(_oled_update)
classify = jit(_classify)
class_sum = _class_sum if ENABLED else None
lowest_idle = _lowest_idle if ENABLED else None
split_misses = _split_misses if ENABLED else None
plan_access = jit(_plan_access)

_warm = False


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel once, on tiny inputs.

    Called when a policy that uses them is built, so the first forward of a live run does not
    pay the ~1-3 s of compilation (0.1-1 s to load it from the on-disk cache).
    """
    global _warm
    if _warm or not ENABLED:
        return
    ids = np.zeros((1, 2), dtype=np.int64)
    cls = np.zeros(1, dtype=np.intp)
    stab = np.ones(10)
    score, acc = np.zeros(2), np.zeros(2)
    score_update_gated(ids, np.ones((1, 2), dtype=np.float32), cls, stab, True, score, 0.5, acc)
    score_update_flat(ids, np.zeros(2, dtype=np.intp), stab, score, 0.5, acc)
    measure(ids, ids, cls, np.zeros(2, dtype=np.intp), np.zeros(10, dtype=np.int64), True,
            np.zeros((2, 10)), 0.98, np.ones((2, 10)), 0.05, np.empty(10))
    no = np.zeros(1, dtype=bool)
    classify(no, np.zeros(1), no, no, False, 0.9, 4, np.arange(5, dtype=np.intp), np.empty(1, dtype=np.intp),
             np.zeros(10, dtype=np.int64))
    for gate_mode in (0, 1):
        oled_update(ids, np.ones((1, 2), dtype=np.float32), gate_mode, cls, np.zeros(2, dtype=np.intp), ids, cls,
                    np.zeros(2, dtype=np.intp), np.zeros(10, dtype=np.int64), True, ids.copy(), np.zeros((2, 10)),
                    0.98, np.ones((2, 10)), 0.05, np.empty(10), score, 0.5, acc)
    class_sum(ids.reshape(-1), np.zeros(2, dtype=np.intp), stab, np.empty(2))
    lowest_idle(np.ones(2, dtype=bool), np.zeros(2, dtype=np.int64), np.zeros(2), 1)
    split_misses(np.ones(2, dtype=np.int64), np.zeros(2), np.ones(2, dtype=bool), 1, 0.0, 1.0,
                 0.0, 1.0, 1.0, 1.0, 1.0, np.zeros(2, dtype=bool))
    for mode in (1, 2):  # one access of a 1-layer, 2-expert, 1-slot cache: a copy and a CPU miss
        tables = np.stack((np.full((1, 2), -1), np.zeros((1, 2), dtype=np.int64)))
        plan_access(0, np.ones(2, dtype=np.int64), np.zeros((1, 2, 2), dtype=bool), tables, np.ones(1, dtype=np.int64),
                    np.full(1, -1), np.zeros(2), np.ones(2, dtype=bool), False, mode, np.ones(2), ids.reshape(-1),
                    np.zeros(2, dtype=np.intp), stab, 1, 2, True, 1, 1.0, np.array([1.0, 0.0, 1.0, 1.0, 1.0, 1.0]),
                    np.zeros((10, 10), dtype=np.int64))
    _warm = True
