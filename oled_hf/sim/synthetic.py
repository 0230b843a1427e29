"""Synthetic block-diffusion routing traces with the locality the method relies on.

Used by tests and ``eval/replay_speed.py`` when no recorded trace is at hand. The generator plays a
decoder and a router:

* Decoder: per block, every position starts masked; its confidence rises as
  ``sigmoid(a + b * iteration)`` (per-position difficulty a, speed b); each iteration commits
  masked positions with confidence >= threshold, at least the most confident one.
* Router: per layer, popularity logits (scale per layer; drifting per block) plus a per-position noise
  vector; a position's route is the top-k of their sum, gate weights a softmax over those k.
  Between iterations each noise element is redrawn with probability ``1 - keep``, where keep is
  ``stable_keep`` for decoded/committed positions, ``confident_keep`` for confident masked ones,
  and interpolates from ``unsure_keep`` upwards with confidence for unsure masked ones: settled
  tokens keep their routes, unsure ones change theirs.

* Predicted next-layer routes (trace version 2): layer l's prediction is the top-k of its
  popularity plus a noise vector that keeps each element of the true one with probability
  ``predict_keep`` (else redrawn), standing in for layer l's router applied to layer l-1's output.
  A separate random stream, so the routes are the same with or without predictions.

Each sequence is: a prefill forward (prompt rows), then per block: block start, one denoise forward
+ event per iteration, a KV-refresh forward, block end. Everything goes through :class:`TraceWriter`.
"""

from __future__ import annotations

import numpy as np
import torch

from oled_hf.modeling.events import IterationEvent

from .trace import Trace, TraceWriter


def _routes(rng_logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.argpartition(-rng_logits, k - 1, axis=-1)[..., :k]
    logits = np.take_along_axis(rng_logits, ids, axis=-1)
    w = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return ids, (w / w.sum(axis=-1, keepdims=True)).astype(np.float32)


def synthetic_trace(
    *,
    num_layers: int = 4,
    num_experts: int = 32,
    top_k: int = 4,
    block_length: int = 16,
    num_blocks: int = 3,
    batch: int = 1,
    num_sequences: int = 1,
    prompt_length: int = 8,
    threshold: float = 0.9,
    popularity_scale: float | list[float] = 1.0,
    route_noise: float = 1.0,
    drift: float = 0.3,
    stable_keep: float = 0.97,
    confident_keep: float = 0.9,
    unsure_keep: float = 0.2,
    hidden_size: int = 64,
    moe_intermediate_size: int = 32,
    seed: int = 0,
    predict_keep: float | None = 0.7,
) -> Trace:
    """A deterministic synthetic trace (same arguments, same trace)."""
    rng = np.random.default_rng(seed)
    L, E, k, B = num_layers, num_experts, top_k, block_length
    rows = batch * B
    writer = TraceWriter(L, E, k, B, hidden_size=hidden_size, moe_intermediate_size=moe_intermediate_size,
                         model="synthetic", decoding={"threshold": threshold, "seed": seed})
    scale = np.broadcast_to(np.asarray(popularity_scale, dtype=np.float64), (L,)).reshape(L, 1, 1)
    pop = rng.normal(size=(L, 1, E)) * scale
    prng = np.random.default_rng([seed, 7919])

    def predicted(noise: np.ndarray):
        if predict_keep is None:
            return None
        keep = prng.random(size=noise.shape) < predict_keep
        ids, w = _routes(pop + route_noise * np.where(keep, noise, prng.normal(size=noise.shape)), k)
        return [None] + list(ids[1:]), [None] + list(w[1:])
    for seq in range(num_sequences):
        writer.begin_sequence(seq)
        prompt_noise = rng.normal(size=(L, batch * prompt_length, E))
        ids, w = _routes(pop + route_noise * prompt_noise, k)
        writer.add_forward("prefill", -1, -1, list(ids), list(w), predicted(prompt_noise))
        for block in range(num_blocks):
            pop = pop + rng.normal(0.0, drift, size=pop.shape)
            noise = rng.normal(size=(L, rows, E))
            a = rng.normal(-2.0, 1.5, size=rows)
            b = rng.uniform(0.4, 1.2, size=rows)
            masked = np.ones(rows, dtype=bool)
            tokens = np.full(rows, -1, dtype=np.int64)  # -1 = mask id in this toy
            writer.on_block_start(block, torch.from_numpy(tokens.reshape(batch, B)))
            it = 0
            while masked.any():
                ids, w = _routes(pop + route_noise * noise, k)
                writer.add_forward("denoise", block, it, list(ids), list(w), predicted(noise))
                conf = 1.0 / (1.0 + np.exp(-(a + b * it)))
                commit = masked & (conf >= threshold)
                if not commit.any():
                    commit[np.flatnonzero(masked)[np.argmax(conf[masked])]] = True
                start_masked = masked.copy()
                tokens[commit] = rng.integers(0, 1000, size=int(commit.sum()))
                masked &= ~commit
                reported = np.where(start_masked, conf, 1.0).astype(np.float32)
                writer.on_iteration(IterationEvent(
                    block, it,
                    torch.from_numpy(start_masked.reshape(batch, B)),
                    torch.from_numpy(reported.reshape(batch, B)),
                    torch.from_numpy(commit.reshape(batch, B)),
                    torch.from_numpy(tokens.reshape(batch, B).copy()),
                ))
                unsure = unsure_keep + (confident_keep - unsure_keep) * np.minimum(conf / threshold, 1.0)
                keep = np.where(~masked, stable_keep, np.where(conf >= threshold, confident_keep, unsure))
                redraw = rng.random(size=(L, rows, E)) >= keep[None, :, None]
                noise = np.where(redraw, rng.normal(size=(L, rows, E)), noise)
                it += 1
            ids, w = _routes(pop + route_noise * noise, k)
            writer.add_forward("refresh", block, it, list(ids), list(w), predicted(noise))
            writer.on_block_end(block, torch.from_numpy(tokens.reshape(batch, B).copy()))
    return writer.trace()
