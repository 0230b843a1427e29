"""Predictors of the next iteration's experts, and the pure-caching oracle ladder.

Why: a retention policy is a predictor of which experts the coming accesses of a layer will use.
Before building a better one we measure (1) how well candidate predictors guess the *next*
access's expert set, and (2) how much hit rate a demand cache gains from knowing that set exactly
versus knowing the whole future (Belady). If an oracle of the next set is close to MIN, the
headroom is in predicting the next set; if it is far below, it is in longer-horizon value.

**Accesses.** Every forward (prefill, denoise, refresh) is one access per MoE layer, with the set of
experts it routes; the cache sees them in trace order, so "the next iteration" of access t is
access t+1 of the same layer (the next forward, whatever its kind). Each target access has a
*position*: ``prefill``, ``first`` (iteration 0 of a block: the prediction crosses a block
boundary), ``middle``, ``last`` (the block's last denoising iteration) or ``refresh`` (the KV-refresh
forward after a block). A denoising forward's rows get a *token class* from its iteration event:
``decoded`` (not masked, not edited), ``committed`` (masked at the start, committed now),
``edited`` (LLaDA2.1 replaced the token) or ``masked lo-hi`` (still masked, by confidence bin).

**Predictors** of S_{t+1} from what is known after access t (:func:`predictor_quality`):

* ``previous``: S_t;
* ``persisting``: the experts of S_t routed by rows that keep their input (masked-and-uncommitted
  or decoded rows; committed and edited rows, whose input embedding changes, are dropped);
  forwards without an event (prefill, refresh) fall back to S_t;
* ``weighted``: each route r of access t persists with probability q[layer, class(r)] (the
  per-token route persistence measured on a *dev* trace, :func:`persistence_table`); an expert's
  score is ``1 - prod_r (1 - q_r)`` and the set is the experts scoring >= 0.5;
* ``periodic`` (f): the set of the latest earlier forward of the same sequence with the target's
  kind and iteration (a block start is predicted by the previous block start);
* ``phase starts`` (g): before a block or prompt start, the experts earlier starts used at least
  half the time (as a score: the share of earlier starts that used each expert); else S_t;
* ``token memory`` (h): ``persisting``, plus for each committed (or edited) row the k experts its
  new token id routed to most often as a decoded row earlier in the trace;
* ranked top-C at C slots: ``lru`` (recency, as ``LRUPolicy`` ranks), ``lfu`` (``LFUPolicy``),
  ``weighted`` (the score above, then recency) and ``oled`` (``OledPolicy``'s priority, replayed);
  ``keep-C`` is the same ranking after S_t (which a demand cache holds anyway).

Precision = |P & S_{t+1}| / |P|, recall = |P & S_{t+1}| / |S_{t+1}|, pooled over accesses (micro),
per layer and per target position; *returns recall* is the recall of S_{t+1} minus S_t, the only
experts a demand cache's eviction choice decides (:func:`return_ages` bins returns by how long ago
they were last used). Per-token route persistence (the share of a row's top-k kept by the same row
at t+1, for pairs of forwards of the same block and rows) is reported per class.

**Ladder** (:func:`cache_ladder`): per layer at capacity C, CPU compute off (every miss copied),
uniform split, cold start; hits counted per unique expert per access as the planner counts them.
Every rung but MIN is a priority fed to :func:`demand_cache`, which applies the planner's
CPU-off rules (``oled_hf/offload/planner.py``): misses copied in ascending priority, each into a
free slot, else evicting the lowest-priority resident the access does not request, else (the
request exceeds C) streaming through the slot of the lowest-priority expert this access already
computed. Rungs: ``MIN`` (``belady_min``, demand paging) and ``MIN+bypass`` (the bound replay
prints); ``next-oracle h`` (knows the next h sets: experts used within h accesses are kept
first, sooner first, then LRU; h=1 is the next-iteration oracle); ``previous set`` (experts not
used by access t-1 go first, then LRU: among the experts an access can evict this equals LRU,
so it differs only where a request exceeds C); ``lru``; ``lfu``; ``oled`` (its priorities);
the predictors (b), (c), (f), (g), (h) used as retention (predicted set or score first, then LRU);
and ``combined`` (:func:`combined_priorities`), an exploratory rule tuned on a dev trace.

Structural consequence (why confidence alone cannot beat LRU here): a demand cache must hold S_t,
so its evictions are always among experts the current access does *not* use. A score that only
ranks S_t's experts (persisting, weighted) changes nothing unless the request exceeds C; oled's
decayed score does rank idle experts, but by their past stability-weighted use, i.e. recency and
frequency again. A better retention rule has to predict which *idle* experts return.

Information timing (why the event-based rungs are optimistic): the ladder evicts at access t with
the priority made after access t, and the predictors (b), (c), (h) and ``combined`` read forward
t's iteration event (which rows committed, their new token ids). A live planner plans access t
*during* forward t, before that event exists: it knows event t-1 at best. Those rungs therefore
know one iteration more than a policy can; their gain over ``lru`` is an upper bound of what the
same signal gives live. ``oled`` (replayed in timeline order, the event after the access), ``lru``,
``lfu``, ``previous set`` and ``phase starts`` (the decoder announces a block start; a prompt start
is assumed to follow a finished request) know nothing a live policy does not. Measured live, in
replay with the planner's rules (``offload/policies/phase.py``, the block-start signal alone):
+0.0 to +0.4 hit-rate points over LRU on the dev trace at block 16, where the ladder's (g), which
also anticipates prompt starts, shows +0.9.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..offload.trace import KINDS, OP_EVENT, OP_FORWARD, Trace
from .belady import belady_min, next_uses, request_sets
from .routing_stats import CONFIDENCE_BINS, token_persistence

POSITIONS = ("prefill", "first", "middle", "last", "refresh")
DECODED, COMMITTED, EDITED, MASKED = 0, 1, 2, 3  # MASKED .. MASKED + bins - 1: masked by confidence bin
NO_EVENT = -1
BIG = 1e9  # above any recency clock: "predicted" outranks every LRU tie-break
CAPACITY_PCTS = (15, 25, 40)


def class_labels(bins: tuple[float, ...] = CONFIDENCE_BINS) -> list[str]:
    """Label of every token class code: decoded, committed, edited, then one per masked confidence bin."""
    return ["decoded", "committed", "edited"] + [f"masked {lo:.2f}-{min(hi, 1.0):.2f}"
                                                  for lo, hi in zip(bins[:-1], bins[1:])]


def token_classes(masked: np.ndarray, confidence: np.ndarray, committed: np.ndarray, edited: np.ndarray,
                  bins: tuple[float, ...] = CONFIDENCE_BINS) -> np.ndarray:
    """Class code per row of one iteration event (see the module docstring)."""
    b = np.clip(np.searchsorted(bins, confidence, side="right") - 1, 0, len(bins) - 2)
    unsettled = np.where(committed, COMMITTED, MASKED + b)
    return np.where(masked, unsettled, np.where(edited, EDITED, DECODED)).astype(np.int64)


@dataclass
class Accesses:
    """A trace as the cache sees it: one access per forward and MoE layer."""

    num_layers: int
    num_experts: int
    sets: np.ndarray  # bool [L, F, E]: experts requested
    counts: np.ndarray  # int [L, F, E]: tokens routed to each expert
    position: np.ndarray  # int [F]: index into POSITIONS
    seq: np.ndarray  # int [F]
    block: np.ndarray  # int [F]
    kind: np.ndarray  # int [F]: index into trace.KINDS
    iteration: np.ndarray  # int [F]: iteration within the block (-1: prefill)
    ids: list[np.ndarray]  # per forward: [L, T, k]
    row_class: list[np.ndarray | None]  # per forward: class code per row from its event, None without one
    num_classes: int = 0
    row_token: list[np.ndarray | None] = field(default_factory=list)  # per forward: token id per row after it


def accesses(trace: Trace, bins: tuple[float, ...] = CONFIDENCE_BINS) -> Accesses:
    """Every forward's request sets, counts, target position and (denoise) token classes."""
    a = trace.arrays
    F, L, E = trace.num_forwards, trace.num_layers, trace.num_experts
    sets = request_sets(trace)
    counts = np.zeros((L, F, E), dtype=np.int64)
    ids = [trace.routing(i)[0].astype(np.int64) for i in range(F)]
    for i, x in enumerate(ids):
        for layer in range(L):
            counts[layer, i] = np.bincount(x[layer].reshape(-1), minlength=E)
    kind = a["fwd_kind"].astype(np.int64)
    seq, block, it = (a[k].astype(np.int64) for k in ("fwd_seq", "fwd_block", "fwd_iter"))
    row_class: list[np.ndarray | None] = [None] * F
    row_token: list[np.ndarray | None] = [None] * F
    pending = None
    for op, i in trace.ops():
        if op == OP_FORWARD:
            pending = i if KINDS[kind[i]] == "denoise" else None
        elif op == OP_EVENT and pending is not None:
            ev = trace.event(i)
            m = ev.masked.numpy().reshape(-1)
            if m.shape[0] == ids[pending].shape[1]:  # rows = batch * block positions
                row_class[pending] = token_classes(m, ev.confidence.numpy().reshape(-1),
                                                   ev.committed.numpy().reshape(-1),
                                                   ev.edited_or_none().numpy().reshape(-1), bins)
                row_token[pending] = ev.token_ids.numpy().reshape(-1).astype(np.int64)
            pending = None
    denoise = kind == KINDS.index("denoise")
    same_next = np.zeros(F, dtype=bool)  # the next forward is a denoise of the same sequence and block
    same_next[:-1] = denoise[1:] & (seq[1:] == seq[:-1]) & (block[1:] == block[:-1])
    position = np.where(kind == KINDS.index("prefill"), 0, np.where(kind == KINDS.index("refresh"), 4,
                        np.where(it == 0, 1, np.where(same_next, 2, 3))))
    return Accesses(L, E, sets, counts, position.astype(np.int64), seq, block, kind, it, ids, row_class,
                    MASKED + len(bins) - 1, row_token)


# ---------------------------------------------------------------------------------------- priorities
def lru_priorities(counts: np.ndarray) -> np.ndarray:
    """[F, E] ``LRUPolicy``'s priority after each access of one layer ([F, E] token counts).

    The clock of forward t is t + 1 (the controller ticks before the first layer); experts of one
    access tie-break by their share of its tokens, exactly as ``LRUPolicy._update`` computes it.
    """
    F, E = counts.shape
    out = np.empty((F, E))
    last = np.full(E, -1.0)
    for t in range(F):
        c = counts[t]
        used = c > 0
        last[used] = (t + 1) + 0.5 * c[used] / (np.maximum.reduce(c) + 1.0)
        out[t] = last
    return out


def lfu_priorities(counts: np.ndarray) -> np.ndarray:
    """[F, E] ``LFUPolicy``'s priority after each access: accesses using the expert, ties by recency."""
    F, E = counts.shape
    out = np.empty((F, E))
    freq, last = np.zeros(E), np.zeros(E)
    for t in range(F):
        used = counts[t] > 0
        freq[used] += 1.0
        last[used] = t + 2.0  # clock + 1
        out[t] = freq + last / (t + 3.0)  # the policy's own clock is then t + 2
    return out


def horizon_priorities(sets: np.ndarray, lru: np.ndarray, h: int) -> np.ndarray:
    """[F, E] the next-h oracle of one layer ([F, E] sets; ``lru`` from :func:`lru_priorities`): experts
    used within h accesses first (sooner first), then LRU. h=1 is the next-iteration oracle."""
    dist = next_uses(sets[None])[0] - np.arange(sets.shape[0])[:, None]
    return np.where(dist <= h, BIG * (h + 1 - np.minimum(dist, h + 1)), 0.0) + lru


def previous_set_priorities(sets: np.ndarray, lru: np.ndarray) -> np.ndarray:
    """[F, E] "keep the previous iteration's set": experts of access t-1 first, then LRU."""
    prev = np.zeros(sets.shape)
    prev[1:] = sets[:-1]
    return BIG * prev + lru


def predicted_set_priorities(predicted: np.ndarray, lru: np.ndarray) -> np.ndarray:
    """[F, E] a predictor used as retention: its score (a set as 0/1, or a probability) x BIG, then LRU."""
    return BIG * predicted.astype(np.float64) + lru


TIE_WEIGHT = 0.45  # chosen on the dev trace at block 16 among 0.1, 0.3, 0.45 (held-out never looked at)


def combined_priorities(lru: np.ndarray, periodic: np.ndarray, phase: np.ndarray, memory: np.ndarray,
                        weighted: np.ndarray, tie: float = TIE_WEIGHT) -> np.ndarray:
    """[F, E] the exploratory rung "combined": recency first; inside one access's experts (LRU's
    fractional tie-break, < 0.5) the mean of the four signals (f), (g), (h), (c) times ``tie`` < 0.5,
    so a signal never outranks a more recent access; plus the (g)/(h) predicted set above all."""
    if not 0.0 <= tie < 0.5:
        raise ValueError(f"tie={tie} must be in [0, 0.5): larger would outrank a more recent access")
    signals = (periodic.astype(np.float64) + phase + memory + weighted) / 4.0
    return lru + tie * signals + BIG * np.maximum(memory.astype(np.float64), phase)


def policy_priorities(trace: Trace, policy: Any) -> np.ndarray:
    """[L, F, E] a ``CachePolicy``'s priority after each access, replaying the trace's timeline into it
    (routing, then events and block markers, as the controller delivers them; clock = forward + 1)."""
    L, E = trace.num_layers, trace.num_experts
    out = np.empty((L, trace.num_forwards, E))
    clock = 0
    for op, i in trace.ops():
        if op == OP_FORWARD:
            clock += 1
            ids, w = trace.routing(i)
            for layer in range(L):
                x = ids[layer].astype(np.int64)
                policy.observe_access(layer, x, w[layer], clock, np.bincount(x.reshape(-1), minlength=E))
                out[layer, i] = policy.priority_array(layer)
        else:
            trace.deliver(policy, op, i)
    return out


def oled_priorities(trace: Trace, config: Any = None) -> np.ndarray:
    """[L, F, E] ``OledPolicy``'s priorities with ``config``'s knobs (default: ``OffloadConfig``'s)."""
    from oled_hf.offload.config import OffloadConfig
    from oled_hf.offload.policies import make_policy

    cfg = config if config is not None else OffloadConfig(cache_size=1)
    return policy_priorities(trace, make_policy("oled", trace.num_layers, trace.num_experts, cfg))


# ---------------------------------------------------------------------------------------- cache
def demand_cache(sets: np.ndarray, priority: np.ndarray, capacity: int,
                 hit_mask: np.ndarray | None = None) -> np.ndarray:
    """Hits per access ([F] int) of one layer's demand cache, the planner's CPU-off rules (module docstring).

    ``sets`` [F, E] bool, ``priority`` [F, E] (after each access's update; higher = keep), cold start;
    ``hit_mask`` ([F, E] bool, optional) receives which experts hit.
    """
    F, E = sets.shape
    if not 1 <= capacity <= E:
        raise ValueError(f"capacity={capacity} must be in [1, num_experts={E}]")
    resident = np.zeros(E, dtype=bool)
    hits = np.zeros(F, dtype=np.int64)
    for t in range(F):
        req = np.flatnonzero(sets[t])
        prio = priority[t]
        hit = req[resident[req]]
        miss = req[~resident[req]]
        hits[t] = hit.size
        if hit_mask is not None:
            hit_mask[t, hit] = True
        if not miss.size:
            continue
        order = miss[np.argsort(prio[miss], kind="stable")]  # ascending priority, ties by id
        n_free = capacity - int(resident.sum())
        need = order.size - n_free
        idle = np.flatnonzero(resident & ~sets[t])
        victims = idle[np.argsort(prio[idle], kind="stable")][:max(need, 0)]
        if need <= victims.size:
            resident[victims] = False
            resident[order] = True
            continue
        resident[victims] = False  # every idle expert goes; the rest streams through computed slots
        free = capacity - int(resident.sum())
        heap = [(float(prio[x]), int(x)) for x in hit]
        heapq.heapify(heap)
        for e in order.tolist():
            if free:
                free -= 1
            else:
                if not heap:  # the hits and every earlier copy: never empty once the layer is full
                    raise AssertionError("no slot to stream through")
                resident[heapq.heappop(heap)[1]] = False
            resident[e] = True
            heapq.heappush(heap, (float(prio[e]), e))
    return hits


@dataclass
class LadderRow:
    name: str
    capacity: int
    hits: int
    requests: int
    per_layer_hits: list[int] = field(default_factory=list)
    per_position_hits: list[int] = field(default_factory=list)  # by the access's position (POSITIONS)
    per_position_requests: list[int] = field(default_factory=list)
    return_hits_by_age: list[int] = field(default_factory=list)  # hit returns by age (:func:`return_ages`)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.requests if self.requests else 0.0


def _by_position(values: np.ndarray, position: np.ndarray) -> list[int]:
    """[L, F] per-access values summed per position of the access."""
    return [int(values[:, position == j].sum()) for j in range(len(POSITIONS))]


def _row(name: str, capacity: int, acc: Accesses, prio: Callable[[int], np.ndarray]) -> LadderRow:
    mask = np.zeros(acc.sets.shape, dtype=bool)
    hits = np.stack([demand_cache(acc.sets[layer], prio(layer), capacity, mask[layer])
                     for layer in range(acc.num_layers)])
    return LadderRow(name, capacity, int(hits.sum()), int(acc.sets.sum()), hits.sum(1).tolist(),
                     _by_position(hits, acc.position), _by_position(acc.sets.sum(-1), acc.position),
                     return_ages(acc, hits=mask).sum(0).tolist())


def cache_ladder(trace: Trace, capacities: list[int], *, acc: Accesses | None = None,
                 table: PersistenceTable | None = None, horizons: tuple[int, ...] = (1, 2, 4, 16),
                 oled: np.ndarray | None = None) -> list[LadderRow]:
    """Every rung of the module docstring at each per-layer capacity (uniform split, CPU off).

    ``table`` (from a dev trace) enables the ``weighted`` rung; ``oled`` ([L, F, E] priorities, default
    computed with ``OffloadConfig``'s knobs) the oled rung; pass ``oled=np.zeros(0)`` to skip it.
    """
    acc = acc if acc is not None else accesses(trace)
    sets, counts = acc.sets, acc.counts
    L = acc.num_layers
    lru = [lru_priorities(counts[layer]) for layer in range(L)]
    lfu = [lfu_priorities(counts[layer]) for layer in range(L)]
    hor = {h: [horizon_priorities(sets[layer], lru[layer], h) for layer in range(L)] for h in horizons}
    prev = [previous_set_priorities(sets[layer], lru[layer]) for layer in range(L)]
    pers = persisting_sets(acc)
    pers_p = [predicted_set_priorities(pers[layer], lru[layer]) for layer in range(L)]
    periodic = periodic_sets(acc)
    per_p = [predicted_set_priorities(periodic[layer], lru[layer]) for layer in range(L)]
    phase = phase_scores(acc)
    phase_p = [predicted_set_priorities(phase[layer], lru[layer]) for layer in range(L)]
    mem = token_memory_sets(acc)
    mem_p = [predicted_set_priorities(mem[layer], lru[layer]) for layer in range(L)]
    both_p = [predicted_set_priorities(np.maximum(mem[layer], phase[layer]), lru[layer]) for layer in range(L)]
    wt_p = combo_p = None
    if table is not None:
        w = weighted_scores(acc, table)
        wt_p = [predicted_set_priorities(w[layer], lru[layer]) for layer in range(L)]
        combo_p = [combined_priorities(lru[layer], periodic[layer], phase[layer], mem[layer], w[layer])
                   for layer in range(L)]
    if oled is None:
        oled = oled_priorities(trace)
    rows: list[LadderRow] = []
    for c in capacities:
        for bypass in (False, True):
            b = belady_min(trace, c, bypass=bypass)
            rows.append(LadderRow(b.name, c, b.hits, b.hits + b.misses, list(b.per_layer_hits)))
        for h in horizons:
            rows.append(_row("next-oracle" if h == 1 else f"next-{h} oracle", c, acc, lambda l, h=h: hor[h][l]))
        rows.append(_row("previous set", c, acc, lambda l: prev[l]))
        rows.append(_row("lru", c, acc, lambda l: lru[l]))
        rows.append(_row("lfu", c, acc, lambda l: lfu[l]))
        if oled.size:
            rows.append(_row("oled", c, acc, lambda l: oled[l]))
        rows.append(_row("persisting (b) + lru", c, acc, lambda l: pers_p[l]))
        if wt_p is not None:
            rows.append(_row("weighted (c) + lru", c, acc, lambda l: wt_p[l]))
        rows.append(_row("periodic (f) + lru", c, acc, lambda l: per_p[l]))
        rows.append(_row("phase starts (g) + lru", c, acc, lambda l: phase_p[l]))
        rows.append(_row("token memory (h) + lru", c, acc, lambda l: mem_p[l]))
        rows.append(_row("(g) + (h) + lru", c, acc, lambda l: both_p[l]))
        if combo_p is not None:
            rows.append(_row("combined (c,f,g,h)", c, acc, lambda l: combo_p[l]))
    return rows


# ---------------------------------------------------------------------------------------- predictors
@dataclass
class PersistenceTable:
    """Per layer and token class: summed kept fraction of a row's top-k into the next forward, and rows.

    ``set_kept``/``set_used`` (per layer): for accesses without an event (prefill, refresh), the
    experts of S_t also in S_{t+1} and |S_t| (the set-level survival the weighted predictor uses there).
    """

    labels: list[str]
    kept: np.ndarray  # [L, C]
    rows: np.ndarray  # [L, C]
    set_kept: np.ndarray  # [L]
    set_used: np.ndarray  # [L]

    def rate(self, min_rows: int = 20) -> np.ndarray:
        """[L, C] mean persistence; a cell with < ``min_rows`` rows takes the class's pooled rate
        over layers, and a class never seen the overall rate."""
        pooled = self.kept.sum(0) / np.maximum(self.rows.sum(0), 1)
        overall = self.kept.sum() / max(self.rows.sum(), 1)
        pooled = np.where(self.rows.sum(0) >= min_rows, pooled, overall)
        per = self.kept / np.maximum(self.rows, 1)
        return np.where(self.rows >= min_rows, per, pooled[None, :])

    def set_rate(self) -> np.ndarray:
        return self.set_kept / np.maximum(self.set_used, 1)


def _same_rows(acc: Accesses, t: int) -> bool:
    """Whether access t+1 routes the same rows as t (a later forward of the same block: denoise or refresh)."""
    return (t + 1 < len(acc.ids) and acc.position[t + 1] in (2, 3, 4) and acc.seq[t + 1] == acc.seq[t]
            and acc.block[t + 1] == acc.block[t] and acc.ids[t + 1].shape == acc.ids[t].shape)


def persistence_table(acc: Accesses, bins: tuple[float, ...] = CONFIDENCE_BINS) -> PersistenceTable:
    """Per-token route persistence by class (rows of a forward with an event, next forward same rows)."""
    L, C = acc.num_layers, acc.num_classes
    kept, rows = np.zeros((L, C)), np.zeros((L, C))
    set_kept, set_used = np.zeros(L), np.zeros(L)
    for t in range(len(acc.ids) - 1):
        cls = acc.row_class[t]
        if cls is None:
            both = acc.sets[:, t] & acc.sets[:, t + 1]
            set_kept += both.sum(-1)
            set_used += acc.sets[:, t].sum(-1)
            continue
        if not _same_rows(acc, t):
            continue
        k = token_persistence(acc.ids[t], acc.ids[t + 1])  # [L, T]
        for layer in range(L):
            kept[layer] += np.bincount(cls, weights=k[layer], minlength=C)
            rows[layer] += np.bincount(cls, minlength=C)
    return PersistenceTable(class_labels(bins), kept, rows, set_kept, set_used)


def persisting_sets(acc: Accesses) -> np.ndarray:
    """[L, F, E] predictor (b): experts of access t routed by rows that are neither committed nor edited."""
    out = acc.sets.copy()
    for t, cls in enumerate(acc.row_class):
        if cls is None:
            continue
        keep = (cls != COMMITTED) & (cls != EDITED)
        for layer in range(acc.num_layers):
            s = np.zeros(acc.num_experts, dtype=bool)
            s[acc.ids[t][layer][keep].reshape(-1)] = True
            out[layer, t] = s
    return out


def periodic_sets(acc: Accesses) -> np.ndarray:
    """[L, F, E] predictor (f), made after access t for t+1: the set of the latest earlier forward of
    the same sequence with t+1's kind and iteration (a block's first iteration is predicted by the
    previous block's first iteration, a refresh by the previous refresh); S_t where there is none."""
    out = acc.sets.copy()
    latest: dict[tuple[int, int, int], int] = {}
    for t in range(len(acc.ids) - 1):
        latest[(int(acc.seq[t]), int(acc.kind[t]), int(acc.iteration[t]))] = t
        j = latest.get((int(acc.seq[t + 1]), int(acc.kind[t + 1]), int(acc.iteration[t + 1])))
        if j is not None:
            out[:, t] = acc.sets[:, j]
    return out


def token_memory_sets(acc: Accesses, top: int | None = None) -> np.ndarray:
    """[L, F, E] predictor (h): (b), plus for each committed or edited row of access t the ``top``
    (default k) experts its new token id routed to most often as a decoded row in earlier accesses
    of the trace (counts per layer and token id, updated online after each access).

    Why: a committed row's input changes from [MASK] to its token, so its own routes persist little;
    what the same token routed to before is a better guess of where it goes next."""
    out = persisting_sets(acc)
    L, E = acc.num_layers, acc.num_experts
    memory: list[dict[int, np.ndarray]] = [{} for _ in range(L)]
    for t, cls in enumerate(acc.row_class):
        tok = acc.row_token[t] if acc.row_token else None
        if cls is None or tok is None:
            continue
        k = acc.ids[t].shape[-1]
        n = top or k
        moved = np.flatnonzero((cls == COMMITTED) | (cls == EDITED))
        for layer in range(L):
            for r in moved.tolist():
                c = memory[layer].get(int(tok[r]))
                if c is not None:
                    out[layer, t, top_c(c, n) & (c > 0)] = True
            for r in np.flatnonzero(cls == DECODED).tolist():
                c = memory[layer].setdefault(int(tok[r]), np.zeros(E))
                c[acc.ids[t][layer, r]] += 1.0
    return out


def phase_scores(acc: Accesses) -> np.ndarray:
    """[L, F, E] predictor (g)'s score, made after access t for t+1 when t+1 starts a block or a
    prompt (``first`` / ``prefill``; the decoder knows it is coming): the share of earlier accesses
    at that position that used each expert. Zero before other targets."""
    out = np.zeros(acc.sets.shape)
    seen = {j: np.zeros((acc.num_layers, acc.num_experts)) for j in (0, 1)}
    n = dict.fromkeys(seen, 0)
    for t in range(len(acc.ids) - 1):
        j = int(acc.position[t + 1])
        if j in seen and n[j]:
            out[:, t] = seen[j] / n[j]
        if int(acc.position[t]) in seen:  # access t's own set joins its position's history
            seen[int(acc.position[t])] += acc.sets[:, t]
            n[int(acc.position[t])] += 1
    return out


def phase_sets(acc: Accesses) -> np.ndarray:
    """[L, F, E] predictor (g) as a set: before a block/prompt start the experts that earlier starts
    used at least half the time, else S_t."""
    score = phase_scores(acc)
    starts = np.isin(np.roll(acc.position, -1), (0, 1))
    starts[-1] = False
    return np.where(starts[None, :, None], score >= 0.5, acc.sets)


def weighted_scores(acc: Accesses, table: PersistenceTable) -> np.ndarray:
    """[L, F, E] predictor (c): P(expert in the next set) = 1 - prod over its routes of (1 - q[class])."""
    q = np.clip(table.rate(), 0.0, 1.0 - 1e-9)
    qs = table.set_rate()
    out = np.zeros(acc.sets.shape)
    for t, cls in enumerate(acc.row_class):
        if cls is None:
            out[:, t] = acc.sets[:, t] * qs[:, None]
            continue
        k = acc.ids[t].shape[-1]
        for layer in range(acc.num_layers):
            log_miss = np.repeat(np.log1p(-q[layer, cls]), k)
            out[layer, t] = -np.expm1(np.bincount(acc.ids[t][layer].reshape(-1), weights=log_miss,
                                                  minlength=acc.num_experts))
    return out


def top_c(priority: np.ndarray, c: int) -> np.ndarray:
    """[..., E] bool: the ``c`` highest-priority experts (ties by lower id, as the planner's stable sorts)."""
    E = priority.shape[-1]
    order = np.argsort(-priority, axis=-1, kind="stable")[..., :c]
    out = np.zeros(priority.shape, dtype=bool)
    np.put_along_axis(out, order, True, axis=-1)
    return out if c <= E else np.ones(priority.shape, dtype=bool)


@dataclass
class Quality:
    """Pooled counts for one predictor, each [L, positions]: true positives, predicted and true set
    sizes, and the same restricted to *returns* (experts of S_{t+1} that S_t does not use: the only
    ones a demand cache's eviction choice decides, since it must hold S_t anyway)."""

    name: str
    tp: np.ndarray
    pred: np.ndarray
    true: np.ndarray
    tp_returns: np.ndarray
    returns: np.ndarray

    def precision(self, layer: int | None = None, position: int | None = None) -> float:
        return _ratio(self.tp, self.pred, layer, position)

    def recall(self, layer: int | None = None, position: int | None = None) -> float:
        return _ratio(self.tp, self.true, layer, position)

    def returns_recall(self, layer: int | None = None, position: int | None = None) -> float:
        return _ratio(self.tp_returns, self.returns, layer, position)


def _ratio(num: np.ndarray, den: np.ndarray, layer: int | None, position: int | None) -> float:
    sl = (slice(None) if layer is None else layer, slice(None) if position is None else position)
    d = den[sl].sum()
    return float(num[sl].sum() / d) if d else float("nan")


def score_predictor(name: str, predicted: np.ndarray, acc: Accesses) -> Quality:
    """Precision/recall counts of ``predicted`` [L, F, E] (made after access t) against S_{t+1}."""
    L, P = acc.num_layers, len(POSITIONS)
    p, s = predicted[:, :-1], acc.sets[:, 1:]
    ret = s & ~acc.sets[:, :-1]
    pos = acc.position[1:]
    tp, pred, true, tp_r, true_r = (np.zeros((L, P)) for _ in range(5))
    for j in range(P):
        m = pos == j
        tp[:, j] = (p[:, m] & s[:, m]).sum((1, 2))
        pred[:, j] = p[:, m].sum((1, 2))
        true[:, j] = s[:, m].sum((1, 2))
        tp_r[:, j] = (p[:, m] & ret[:, m]).sum((1, 2))
        true_r[:, j] = ret[:, m].sum((1, 2))
    return Quality(name, tp, pred, true, tp_r, true_r)


def predictor_quality(trace: Trace, table: PersistenceTable, capacities: list[int], *,
                      acc: Accesses | None = None, oled: np.ndarray | None = None) -> list[Quality]:
    """Every predictor of the module docstring; ``table`` must come from a dev trace, not this one."""
    acc = acc if acc is not None else accesses(trace)
    L = acc.num_layers
    w = weighted_scores(acc, table)
    per = periodic_sets(acc)
    out = [score_predictor("previous (a)", acc.sets, acc),
           score_predictor("persisting (b)", persisting_sets(acc), acc),
           score_predictor("weighted>=0.5 (c)", w >= 0.5, acc),
           score_predictor("periodic (f)", per, acc),
           score_predictor("previous | periodic", per | acc.sets, acc),
           score_predictor("phase starts (g)", phase_sets(acc), acc),
           score_predictor("persisting + token memory (h)", token_memory_sets(acc), acc)]
    lru = np.stack([lru_priorities(acc.counts[layer]) for layer in range(L)])
    lfu = np.stack([lfu_priorities(acc.counts[layer]) for layer in range(L)])
    ranked = {"lru": lru, "lfu": lfu, "weighted": BIG * w + lru}
    if oled is None:
        oled = oled_priorities(trace)
    if oled.size:
        ranked["oled"] = oled
    held = acc.sets * 1e12  # a demand cache holds S_t: "keep-C" ranks only the other experts
    for c in capacities:
        for name, prio in ranked.items():
            out.append(score_predictor(f"{name} top-{c} (d)" if name in ("lru", "lfu") else f"{name} top-{c}",
                                       top_c(prio, c), acc))
        for name, prio in ranked.items():
            out.append(score_predictor(f"{name} keep-{c}", top_c(held + prio, c), acc))
    return out


@dataclass
class ClassSets:
    """Set-level view per token class at access t: experts the class routes, and those only it routes."""

    labels: list[str]
    used: np.ndarray  # [L, C] experts routed by the class
    used_next: np.ndarray  # [L, C] ... also in S_{t+1}
    only: np.ndarray  # [L, C] experts routed only by the class
    only_next: np.ndarray  # [L, C] ... also in S_{t+1}


def class_sets(acc: Accesses, bins: tuple[float, ...] = CONFIDENCE_BINS) -> ClassSets:
    """How often an expert backed by a token class (or by it alone) is requested by the next access."""
    L, C, E = acc.num_layers, acc.num_classes, acc.num_experts
    used, used_next, only, only_next = (np.zeros((L, C)) for _ in range(4))
    for t in range(len(acc.ids) - 1):
        cls = acc.row_class[t]
        if cls is None:
            continue
        k = acc.ids[t].shape[-1]
        entry = np.repeat(cls, k)
        for layer in range(L):
            flat = acc.ids[t][layer].reshape(-1)
            m = np.zeros((C, E), dtype=bool)
            m[entry, flat] = True
            nxt = acc.sets[layer, t + 1]
            alone = m & (m.sum(0) == 1)[None, :]
            used[layer] += m.sum(1)
            used_next[layer] += (m & nxt).sum(1)
            only[layer] += alone.sum(1)
            only_next[layer] += (alone & nxt).sum(1)
    return ClassSets(class_labels(bins), used, used_next, only, only_next)


AGE_EDGES = (1, 2, 4, 8, 16, 64)  # ages (accesses since last use) binned as 1, 2-3, 4-7, 8-15, 16-63, >= 64


def age_labels(edges: tuple[int, ...] = AGE_EDGES) -> list[str]:
    """Labels of :func:`return_ages`' bins: one per age range, then ``never`` (first use in the layer)."""
    out = [f"{a}" if b - a == 1 else f"{a}-{b - 1}" for a, b in zip(edges[:-1], edges[1:])]
    return out + [f">={edges[-1]}", "never"]


def return_ages(acc: Accesses, edges: tuple[int, ...] = AGE_EDGES, hits: np.ndarray | None = None) -> np.ndarray:
    """[positions, bins] count of returning experts (in S_{t+1}, not in S_t) per target position, by
    age: t minus the access of their last use (age 1: used by access t-1), or ``never`` used before.

    Why: a demand cache must hold S_t, so only returns are decided by retention; young returns are
    what recency keeps, old ones need a longer-horizon value. With ``hits`` ([L, F, E] bool, a cache's
    hit masks) only the returns that cache hit are counted.
    """
    L, F, E = acc.sets.shape
    last = np.full((L, E), -1)
    out = np.zeros((len(POSITIONS), len(edges) + 1), dtype=np.int64)
    for t in range(F - 1):
        last[acc.sets[:, t]] = t
        ret = acc.sets[:, t + 1] & ~acc.sets[:, t]
        if hits is not None:
            ret &= hits[:, t + 1]
        age = t - last[ret]  # >= 1: last use before t (t itself is excluded by ~S_t)
        seen = last[ret] >= 0
        b = np.searchsorted(edges, age[seen], side="right") - 1
        j = int(acc.position[t + 1])
        out[j, :len(edges)] += np.bincount(b, minlength=len(edges))
        out[j, -1] += int((~seen).sum())
    return out
