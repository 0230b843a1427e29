"""Routing statistics of a recorded trace: what a retention policy has to work with.

From the denoising forwards of a trace (each followed by its iteration event), per MoE layer:

* **distinct experts per iteration**: experts routed by one sequence's block in one iteration;
* **activation ratio**: that count over the layer's experts, per iteration and per whole block;
* **adjacent-iteration overlap**: the share of iteration i+1's experts that iteration i already
  used (what an ideal cache of last iteration's experts would hit), inside a block and across a
  block boundary (last iteration of block b -> first of block b+1), plus the cosine similarity of
  per-expert token counts (the measure TIDE reports for LLaDA2.0-mini);
* **route persistence against confidence** (the OLED paper's Figures 7 and 10): per token, the
  share of its top-k experts kept from iteration i to i+1, grouped by the token's state at i:
  already decoded, committed at i, or still masked with its confidence at i in bins.

Pure functions of a :class:`~oled_hf.offload.trace.Trace`; ``eval/routing_overlap.py`` prints and plots.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from ..offload.trace import OP_EVENT, OP_FORWARD, Trace

CONFIDENCE_BINS = (0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 1.0001)


@dataclass
class Step:
    """One denoising iteration of one sequence: routing [layers, T, k] and the event's per-token state."""

    seq: int
    block: int
    iteration: int
    topk_ids: np.ndarray  # [layers, T, k]
    masked: np.ndarray  # [T] bool, masked at the start of the iteration
    confidence: np.ndarray  # [T] float, p(argmax) where masked, 1.0 where decoded
    committed: np.ndarray  # [T] bool


def denoise_steps(trace: Trace) -> Iterator[Step]:
    """Denoising forwards paired with their iteration events, split per batch row (one Step per sequence)."""
    pending = None
    for op, i in trace.ops():
        if op == OP_FORWARD:
            f = trace.forward(i)
            pending = f if f.kind == "denoise" else None
        elif op == OP_EVENT and pending is not None:
            ev = trace.event(i)
            rows = ev.masked.shape[0]
            ids = pending.topk_ids.reshape(trace.num_layers, rows, -1, pending.topk_ids.shape[-1])
            for r in range(rows):
                yield Step(pending.seq * rows + r, pending.block_index, pending.iteration, ids[:, r],
                           ev.masked[r].numpy(), ev.confidence[r].numpy(), ev.committed[r].numpy())
            pending = None


def expert_sets(ids: np.ndarray, num_experts: int) -> np.ndarray:
    """[layers, E] bool: experts routed by any token of the step, per layer."""
    used = np.zeros((ids.shape[0], num_experts), dtype=bool)
    for layer in range(ids.shape[0]):
        used[layer, ids[layer].reshape(-1)] = True
    return used


def expert_counts(ids: np.ndarray, num_experts: int) -> np.ndarray:
    """[layers, E] tokens routed to each expert in the step."""
    return np.stack([np.bincount(ids[layer].reshape(-1), minlength=num_experts) for layer in range(ids.shape[0])])


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    num = (a * b).sum(-1)
    return num / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-12)


def token_persistence(prev: np.ndarray, nxt: np.ndarray) -> np.ndarray:
    """[layers, T]: share of each token's k experts at one iteration that it routes again at the next."""
    k = prev.shape[-1]
    return (prev[..., :, None] == nxt[..., None, :]).any(-1).sum(-1) / k


@dataclass
class RoutingStats:
    num_layers: int
    num_experts: int
    top_k: int
    block_length: int
    steps: int = 0
    blocks: int = 0
    distinct: list[list[float]] = field(default_factory=list)  # per layer: distinct experts of each step
    block_distinct: list[list[float]] = field(default_factory=list)  # per layer: union over a block's steps
    within: list[list[float]] = field(default_factory=list)  # per layer: |S_i & S_i+1| / |S_i+1| inside blocks
    across: list[list[float]] = field(default_factory=list)  # same across block boundaries
    cosine_within: list[list[float]] = field(default_factory=list)
    cosine_across: list[list[float]] = field(default_factory=list)
    iterations_per_block: list[int] = field(default_factory=list)
    # persistence[state][layer] -> list of per-token values; states: "decoded", "committed", masked bins
    persistence: dict[str, list[list[float]]] = field(default_factory=dict)

    def summary(self) -> dict:
        def per_layer(values):
            return [float(np.mean(v)) if len(v) else None for v in values]

        def pooled(values):
            flat = [x for v in values for x in v]
            return float(np.mean(flat)) if flat else None

        return {
            "num_experts": self.num_experts, "top_k": self.top_k, "block_length": self.block_length,
            "routes_per_step": self.block_length * self.top_k, "steps": self.steps, "blocks": self.blocks,
            "iterations_per_block": float(np.mean(self.iterations_per_block)) if self.iterations_per_block else None,
            "distinct_experts_per_iteration": {"per_layer": per_layer(self.distinct), "mean": pooled(self.distinct)},
            "activation_ratio_per_iteration": [x / self.num_experts if x is not None else None
                                               for x in per_layer(self.distinct)],
            "activation_ratio_per_block": [x / self.num_experts if x is not None else None
                                           for x in per_layer(self.block_distinct)],
            "overlap_within_block": {"per_layer": per_layer(self.within), "mean": pooled(self.within),
                                     "pairs": len(self.within[0]) if self.within else 0},
            "overlap_across_blocks": {"per_layer": per_layer(self.across), "mean": pooled(self.across),
                                      "pairs": len(self.across[0]) if self.across else 0},
            "activation_cosine_within_block": pooled(self.cosine_within),
            "activation_cosine_across_blocks": pooled(self.cosine_across),
            "persistence_by_state": {state: {"per_layer": per_layer(v), "mean": pooled(v), "tokens": len(v[0])}
                                     for state, v in self.persistence.items()},
        }


def state_labels(bins: tuple[float, ...] = CONFIDENCE_BINS) -> list[str]:
    """``decoded``, ``committed`` and one ``masked lo-hi`` label per confidence bin."""
    return ["decoded", "committed"] + [f"masked {lo:.2f}-{min(hi, 1.0):.2f}" for lo, hi in zip(bins[:-1], bins[1:])]


def _state_of(step: Step, t: int, labels: list[str], bins: tuple[float, ...]) -> str:
    if not step.masked[t]:
        return labels[0]
    if step.committed[t]:
        return labels[1]
    b = int(np.searchsorted(bins, step.confidence[t], side="right")) - 1
    return labels[2 + min(max(b, 0), len(bins) - 2)]


def routing_stats(trace: Trace, bins: tuple[float, ...] = CONFIDENCE_BINS) -> RoutingStats:
    """All statistics of the module docstring over every sequence of ``trace``."""
    L, E = trace.num_layers, trace.num_experts
    stats = RoutingStats(L, E, int(trace.header["top_k"]), int(trace.header["block_length"]))
    lists = lambda: [[] for _ in range(L)]  # noqa: E731
    stats.distinct, stats.block_distinct, stats.within, stats.across = lists(), lists(), lists(), lists()
    stats.cosine_within, stats.cosine_across = lists(), lists()
    labels = state_labels(bins)
    stats.persistence = {label: lists() for label in labels}
    last: dict[int, tuple[Step, np.ndarray, np.ndarray]] = {}  # per sequence: previous step, sets, counts
    block_union: dict[int, tuple[int, np.ndarray, int]] = {}  # per sequence: block, union of sets, iterations

    def close_block(seq: int) -> None:
        block, union, iters = block_union.pop(seq)
        stats.blocks += 1
        stats.iterations_per_block.append(iters)
        for layer in range(L):
            stats.block_distinct[layer].append(float(union[layer].sum()))

    for step in denoise_steps(trace):
        sets, counts = expert_sets(step.topk_ids, E), expert_counts(step.topk_ids, E)
        stats.steps += 1
        for layer in range(L):
            stats.distinct[layer].append(float(sets[layer].sum()))
        prev = last.get(step.seq)
        if prev is not None:
            p_step, p_sets, p_counts = prev
            same_block = p_step.block == step.block
            share = (p_sets & sets).sum(-1) / np.maximum(sets.sum(-1), 1)
            cos = _cosine(p_counts.astype(float), counts.astype(float))
            for layer in range(L):
                (stats.within if same_block else stats.across)[layer].append(float(share[layer]))
                (stats.cosine_within if same_block else stats.cosine_across)[layer].append(float(cos[layer]))
            if same_block and p_step.topk_ids.shape == step.topk_ids.shape:
                kept = token_persistence(p_step.topk_ids, step.topk_ids)
                for t in range(kept.shape[1]):
                    state = _state_of(p_step, t, labels, bins)
                    for layer in range(L):
                        stats.persistence[state][layer].append(float(kept[layer, t]))
        if step.seq in block_union and block_union[step.seq][0] != step.block:
            close_block(step.seq)
        if step.seq in block_union:
            b, union, iters = block_union[step.seq]
            block_union[step.seq] = (b, union | sets, iters + 1)
        else:
            block_union[step.seq] = (step.block, sets, 1)
        last[step.seq] = (step, sets, counts)
    for seq in list(block_union):
        close_block(seq)
    return stats
