"""What a trace asks of the expert cache, as arrays every bound and offline schedule reads.

Per MoE layer, forward and expert the tokens routed there (:func:`request_counts`), which forwards
are timed (:func:`timed_forwards`: the ones after the warm-up sequences, as replay times them) and
fused residency's time over them (:func:`full_time`, the denominator of every ``x fused``).
"""

from __future__ import annotations

import numpy as np

from oled_hf.offload.costmodel import CostModel

from ..offload.trace import Trace


def request_counts(trace: Trace) -> np.ndarray:
    """Int64 ``[L, F, E]``: tokens routed to each expert by each layer in each forward."""
    ids = trace.arrays["topk_ids"].astype(np.int64)  # [L, R, k]
    rows = np.diff(trace.row_offsets)
    fwd_of_row = np.repeat(np.arange(trace.num_forwards), rows)
    L, E = trace.num_layers, trace.num_experts
    out = np.zeros((L, trace.num_forwards, E), dtype=np.int64)
    for l in range(L):
        np.add.at(out[l], (np.broadcast_to(fwd_of_row[:, None], ids[l].shape), ids[l]), 1)
    return out


def timed_forwards(trace: Trace, warmup_sequences: int = 0) -> np.ndarray:
    """Bool ``[F]``: forwards after the first ``warmup_sequences`` recorded sequences (as replay times them)."""
    seq = trace.arrays["fwd_seq"].astype(np.int64)
    starts = np.concatenate(([True], seq[1:] != seq[:-1])) if seq.size else np.zeros(0, dtype=bool)
    return np.cumsum(starts) > warmup_sequences


def full_time(counts: np.ndarray, timed: np.ndarray, cm: CostModel) -> float:
    """Fused residency over the timed forwards (replay's ``full_time_s``)."""
    total = 0.0
    for t in np.flatnonzero(timed):
        for l in range(counts.shape[0]):
            total += cm.nonexpert_s_per_layer + cm.fused_layer_time(counts[l, t])
    return total
