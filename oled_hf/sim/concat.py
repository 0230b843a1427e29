"""Join routing traces into one, sequence after sequence, to replay a workload that shifts mid-run.

A server does not see one task mix forever: requests of another kind arrive and the routing the
cache learnt stops paying. :func:`concat_traces` builds such a run from traces of the same model
shape (MoE layers, experts, top-k): the timelines follow each other unchanged, forward, event and
marker indices shifted, and the sequences renumbered 0, 1, ... over the whole run, so replay's
``warmup_sequences`` counts them across the joins. It returns where each part starts
(:class:`Segment`), which a study needs to time each part on its own.

:func:`take_sequences` cuts a trace after its first n sequences (the same items, in the same
order): replaying ``take_sequences(t, b)`` with ``warmup_sequences=a`` times sequences a..b-1 with
the cache and the policy as the run left them, i.e. one segment of a concatenated run.

The header is the first trace's (its expert sizes, dtype, decoding); ``model`` names every part.
Replay a concatenation of models with different expert sizes with an explicit cost model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..offload.trace import Trace
from ..offload.trace_format import FORMAT, OP_BLOCK_END, OP_BLOCK_START, OP_EVENT, OP_FORWARD

SHAPE_KEYS = ("num_moe_layers", "num_experts", "top_k")
FWD = ("fwd_kind", "fwd_block", "fwd_iter")
EV = ("ev_block", "ev_iter", "ev_batch")
EV_TOKENS = ("ev_masked", "ev_confidence", "ev_committed", "ev_token_ids")
MK = ("mk_block", "mk_batch")


@dataclass(frozen=True)
class Segment:
    """Where one input trace lies in the concatenation: its first forward and first sequence, and its sequences."""

    start_forward: int
    start_sequence: int
    num_sequences: int

    @property
    def end_sequence(self) -> int:
        return self.start_sequence + self.num_sequences


def sequence_runs(fwd_seq: np.ndarray) -> np.ndarray:
    """Per forward, the index of its sequence counted as replay counts them: a new one wherever fwd_seq changes."""
    if not fwd_seq.size:
        return np.zeros(0, dtype=np.int64)
    return np.cumsum(np.r_[True, fwd_seq[1:] != fwd_seq[:-1]]).astype(np.int64) - 1


def _check_shapes(traces: Sequence[Trace]) -> None:
    if not traces:
        raise ValueError("concat_traces needs at least one trace")
    first = traces[0].header
    for i, t in enumerate(traces[1:], 1):
        for key in SHAPE_KEYS:
            if t.header[key] != first[key]:
                raise ValueError(f"trace {i} has {key}={t.header[key]}, trace 0 has {key}={first[key]}: "
                                 f"only traces with the same {', '.join(SHAPE_KEYS)} can be concatenated")


def _shifted(parts: list[np.ndarray]) -> np.ndarray:
    """Offsets arrays (each 0..n) joined into one: each part after the first shifted by the total before it."""
    out, base = [np.zeros(1, dtype=np.int64)], 0
    for off in parts:
        out.append(off[1:].astype(np.int64) + base)
        base += int(off[-1])
    return np.concatenate(out)


def concat_traces(traces: Sequence[Trace]) -> tuple[Trace, list[Segment]]:
    """One trace holding ``traces`` one after another, and the :class:`Segment` each starts at.

    Every access keeps its order; sequences are renumbered over the whole run. Traces that differ in
    MoE layers, experts or top-k are refused with a ValueError naming the field and both values."""
    _check_shapes(traces)
    arrays = [t.arrays for t in traces]
    segments, fwd, seq0 = [], 0, 0
    seqs, op_index = [], []
    for t, a in zip(traces, arrays):
        runs = sequence_runs(a["fwd_seq"])
        n = int(runs[-1]) + 1 if runs.size else 0
        segments.append(Segment(fwd, seq0, n))
        seqs.append(runs + seq0)
        shift = {OP_FORWARD: fwd, OP_EVENT: sum(int(x["ev_block"].shape[0]) for x in arrays[:len(op_index)]),
                 OP_BLOCK_START: sum(int(x["mk_block"].shape[0]) for x in arrays[:len(op_index)])}
        shift[OP_BLOCK_END] = shift[OP_BLOCK_START]
        op = a["op"].astype(np.int64)
        op_index.append(a["op_index"].astype(np.int64) + np.select([op == k for k in shift], list(shift.values())))
        fwd += t.num_forwards
        seq0 += n
    ids_dtype = np.result_type(*(a["topk_ids"].dtype for a in arrays))
    data: dict = {"format": FORMAT, "header": _header(traces),
                  "op": np.concatenate([a["op"] for a in arrays]).astype(np.int8),
                  "op_index": np.concatenate(op_index),
                  "fwd_seq": np.concatenate(seqs).astype(np.int32),
                  "fwd_rows": _shifted([a["fwd_rows"] for a in arrays]),
                  "topk_ids": np.concatenate([a["topk_ids"] for a in arrays], axis=1).astype(ids_dtype),
                  "topk_weights": np.concatenate([a["topk_weights"] for a in arrays], axis=1),
                  "ev_offsets": _shifted([a["ev_offsets"] for a in arrays]),
                  "mk_offsets": _shifted([a["mk_offsets"] for a in arrays]),
                  "mk_token_ids": np.concatenate([a["mk_token_ids"] for a in arrays])}
    for name in (*FWD, *EV, *EV_TOKENS, *MK):
        data[name] = np.concatenate([a[name] for a in arrays])
    if any("ev_edited" in a for a in arrays):  # older traces lack it: nothing was edited there
        data["ev_edited"] = np.concatenate([a.get("ev_edited", np.zeros(a["ev_masked"].shape, bool)) for a in arrays])
    if any("pred_ids" in a for a in arrays):  # a part without predictions predicts nothing (-1, weight 0)
        data["pred_ids"] = np.concatenate([a["pred_ids"] if "pred_ids" in a else np.full(a["topk_ids"].shape, -1)
                                           for a in arrays], axis=1).astype(ids_dtype)
        data["pred_weights"] = np.concatenate([a["pred_weights"] if "pred_weights" in a else
                                               np.zeros(a["topk_weights"].shape, a["topk_weights"].dtype)
                                               for a in arrays], axis=1)
    data["version"] = 2 if "pred_ids" in data else 1
    return Trace(data), segments


def _header(traces: Sequence[Trace]) -> dict:
    h = dict(traces[0].header)
    h["block_length"] = max(int(t.header["block_length"]) for t in traces)
    h["model"] = " + ".join(str(t.header.get("model", "") or "?") for t in traces)
    for key in ("batch_size", "first_k_dense_replace"):  # kept only where every part agrees
        if len({t.header.get(key) for t in traces}) > 1:
            h.pop(key, None)
    return h


def take_sequences(trace: Trace, n: int) -> Trace:
    """The trace up to (not including) the first forward of its sequence ``n`` (counted as replay counts them)."""
    runs = sequence_runs(trace.arrays["fwd_seq"])
    total = int(runs[-1]) + 1 if runs.size else 0
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= total:
        raise ValueError(f"take_sequences: n={n!r} is invalid: must be an integer in [1, {total}] "
                         "(the trace's sequences)")
    a = trace.arrays
    op, op_index = a["op"], a["op_index"]
    if n == total:
        cut = op.shape[0]
    else:
        first = int(np.flatnonzero(runs == n)[0])
        cut = int(np.flatnonzero((op == OP_FORWARD) & (op_index == first))[0])
    kept_op, kept_idx = op[:cut], op_index[:cut]
    F = int((kept_op == OP_FORWARD).sum())
    V = int((kept_op == OP_EVENT).sum())
    M = int(((kept_op == OP_BLOCK_START) | (kept_op == OP_BLOCK_END)).sum())
    rows, ev, mk = int(a["fwd_rows"][F]), int(a["ev_offsets"][V]), int(a["mk_offsets"][M])
    data: dict = {"format": FORMAT, "version": trace.version, "header": dict(trace.header),
                  "op": kept_op, "op_index": kept_idx, "fwd_rows": a["fwd_rows"][:F + 1],
                  "ev_offsets": a["ev_offsets"][:V + 1], "mk_offsets": a["mk_offsets"][:M + 1],
                  "mk_token_ids": a["mk_token_ids"][:mk]}
    for name in (*FWD, "fwd_seq"):
        data[name] = a[name][:F]
    for name in ("topk_ids", "topk_weights", "pred_ids", "pred_weights"):
        if name in a:
            data[name] = a[name][:, :rows]
    for name in EV:
        data[name] = a[name][:V]
    for name in (*EV_TOKENS, "ev_edited"):
        if name in a:
            data[name] = a[name][:ev]
    for name in MK:
        data[name] = a[name][:M]
    return Trace(data)
