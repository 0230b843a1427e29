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

``generate(SynthParams, TraceShape)`` is the fitted generator (same decoder/router idea, a small parameter set
that ``synth_fit.fit`` estimates from a recorded trace and ``synth_like`` sets from published figures); the
original ``synthetic_trace`` is unchanged (tests and benchmarks depend on its exact output).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from oled_hf.modeling.events import IterationEvent

from ..fileio import write_atomically
from ..offload.trace import Trace, TraceWriter
from .synth_check import MAX_MEMORY_GIB, check_int, check_memory, check_params, memory_bytes


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


# ---------------------------------------------------------------------------------------------------------------
# The fitted generator: a small parameter set (``SynthParams``, estimated by ``synth_fit.fit`` or taken from a
# published model by ``synth_like``) and a trace skeleton (``TraceShape``: sequences, prompt rows, blocks and the
# masked positions each starts with), so a synthetic trace can take a recorded trace's shape.

STATES = ("decoded", "committed")  # plus one "masked lo-hi" state per routing_stats confidence bin


@dataclass
class SynthParams:
    """What the fitted generator needs: shape, decoder and router parameters (per layer where they vary).

    Router: a token's logits at layer l are ``popularity_scale[l] * g_l + block_scale[l] * b_l + eps``, with g_l a
    static popularity (seeded by ``popularity_seed``: dev and held-out synthetic traces share it, as a model's
    expert identities), b_l a block component (carried between the blocks of a sequence with correlation
    ``block_carry[l]``) and eps the token's own noise, carried from iteration i to i+1 with correlation
    ``carry[state][l]`` by the token's state at i (``STATES`` + the masked confidence bins of routing_stats).
    Masked tokens add ``mask_scale[l] * m_l``, a mask component of their own (carried between blocks like b_l;
    None = 0). Recorded traces need it: masked tokens of a step share experts (6 of them route to 18-30
    distinct experts where 6 decoded ones route to 27-31) and their counts have cosine about 0.2 with the
    decoded tokens' of the same step, so a token that commits leaves the experts the block's masked tokens share,
    and the last step of a block (mostly decoded) shares few heavy experts with the next block's first (masked).
    Within a block the logits drift: step i adds ``w_i``, a random walk shared by the block's tokens (w_0 = 0,
    w_{i+1} = w_i + ``step_scale[l]`` * N(0, 1); None = 0), also in the block's refresh forward: the block's
    context moves as positions commit, so the experts it favours move and stay moved. Without it the fitted traces
    route 8-14% fewer distinct experts per block (union over its steps) than the recorded ones at the same distinct
    experts per step and a lower adjacent-step overlap: every token's noise reverts to fixed block-wide logits, so
    a block's churn revisits the same experts where a recorded block's moves on to new ones.
    Predicted next-layer routes use ``predict_carry[l] * eps + fresh``. Decoder: per block a share p ~
    Beta(sure_alpha, sure_beta) of its masked positions is sure (commits at once); each later iteration each
    unsure position becomes sure with probability ``hazard``; an iteration with no sure position commits the most
    confident one. Unsure confidences: threshold * Beta(conf_alpha, conf_beta) + N(0, conf_jitter) per iteration.
    """

    num_layers: int
    num_experts: int
    top_k: int
    block_length: int
    popularity_scale: list[float]
    block_scale: list[float]
    block_carry: list[float]
    carry: dict[str, list[float]]
    predict_carry: list[float] | None = None
    mask_scale: list[float] | None = None
    step_scale: list[float] | None = None
    threshold: float = 0.95
    sure_alpha: float = 1.0
    sure_beta: float = 1.0
    hazard: float = 0.1
    conf_alpha: float = 2.0
    conf_beta: float = 2.0
    conf_jitter: float = 0.05
    hidden_size: int = 2048
    moe_intermediate_size: int = 512
    dtype_bytes: int = 2
    popularity_seed: int = 0
    source: str = ""
    assumptions: list[str] = field(default_factory=list)  # every figure not measured, with its source
    targets: dict[str, Any] = field(default_factory=dict)  # the statistics the parameters were fitted to

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    def check(self) -> SynthParams:
        """Self, after every field's type and range are checked (``synth_check.check_params``); ValueError else."""
        from .routing_stats import state_labels

        check_params(asdict(self), *_field_sets(), state_labels())
        return self

    @classmethod
    def from_json(cls, text: str) -> SynthParams:
        """Parameters from JSON, every field checked before use (NaN, strings for numbers, wrong lengths refused)."""
        from .routing_stats import state_labels

        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a synthetic-workload parameter file: not JSON ({exc})") from exc
        return cls(**check_params(data, *_field_sets(), state_labels()))

    def save(self, path: str) -> None:
        """Written whole or not at all (temporary file beside ``path``, then renamed)."""
        text = self.to_json()
        write_atomically(lambda tmp: Path(tmp).write_text(text), path)

    @classmethod
    def load(cls, path: str) -> SynthParams:
        try:
            text = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: cannot read the parameter file ({exc})") from exc
        try:
            return cls.from_json(text)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc


def _field_sets() -> tuple[set[str], set[str]]:
    """(required, known) keys of a parameter file: SynthParams' fields without a default, all of them."""
    from dataclasses import MISSING

    fs = fields(SynthParams)
    return ({f.name for f in fs if f.default is MISSING and f.default_factory is MISSING}, {f.name for f in fs})


@dataclass
class SeqShape:
    """One sequence's skeleton: prompt rows of its prefill, and per block its index, masked positions per batch
    row at its start, and whether a KV-refresh forward follows it (the recorder skips it after the last block)."""

    prompt_rows: int
    blocks: list[tuple[int, list[int], bool]]


@dataclass
class TraceShape:
    batch: int
    sequences: list[SeqShape]

    @classmethod
    def uniform(cls, num_sequences: int, num_blocks: int, block_length: int, batch: int = 1,
                prompt_length: int = 8) -> TraceShape:
        """Every block fully masked, a refresh after every block but the last (as recorded)."""
        blocks = [(b + 1, [block_length] * batch, b < num_blocks - 1) for b in range(num_blocks)]
        return cls(batch, [SeqShape(batch * prompt_length, list(blocks)) for _ in range(num_sequences)])

    @property
    def num_blocks(self) -> int:
        return sum(len(s.blocks) for s in self.sequences)


def _bin_state(conf: np.ndarray, bins: tuple[float, ...]) -> np.ndarray:
    return np.clip(np.searchsorted(bins, conf, side="right") - 1, 0, len(bins) - 2) + len(STATES)


def state_carry(params: SynthParams, bins: tuple[float, ...]) -> np.ndarray:
    """[states, layers] carry per state index (decoded, committed, masked bins), as generate uses it."""
    labels = list(STATES) + [f"masked {lo:.2f}-{min(hi, 1.0):.2f}" for lo, hi in zip(bins[:-1], bins[1:])]
    return np.asarray([params.carry[s] for s in labels], dtype=np.float64)


class _Decoder:
    """The commit schedule of one block (all batch rows): sure positions commit, else each row's most confident."""

    def __init__(self, p: SynthParams, rng: np.random.Generator, masked: np.ndarray, batch: int) -> None:
        self.p, self.rng, self.batch = p, rng, batch
        self.masked = masked.copy()
        share = rng.beta(p.sure_alpha, p.sure_beta, size=(batch, 1))
        rows = masked.reshape(batch, -1)
        self.sure = (rng.random(rows.shape) < share).reshape(-1) & masked
        self.base = p.threshold * rng.beta(p.conf_alpha, p.conf_beta, size=masked.shape)

    def step(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(masked at start, reported confidence, committed) of one iteration; advances the state."""
        p, n = self.p, self.masked.shape[0]
        conf = np.clip(self.base + self.rng.normal(0.0, p.conf_jitter, size=n), 0.01, p.threshold - 1e-3)
        conf = np.where(self.sure, self.rng.uniform(p.threshold, 1.0, size=n), conf)
        commit = self.masked & self.sure
        rows_m, rows_c, rows_conf = (x.reshape(self.batch, -1) for x in (self.masked, commit, conf))
        for r in range(self.batch):
            if rows_m[r].any() and not rows_c[r].any():
                rows_c[r, np.flatnonzero(rows_m[r])[np.argmax(rows_conf[r][rows_m[r]])]] = True
        start = self.masked.copy()
        self.masked &= ~commit
        self.sure |= self.masked & (self.rng.random(n) < p.hazard)
        return start, np.where(start, conf, 1.0).astype(np.float32), commit


def decoder_rng(seed: int, seq: int, block: int) -> np.random.Generator:
    """The decoder's own stream per block: the commit schedule does not depend on the router's draws nor on the
    other blocks' iterations, so ``decoder_schedule`` reproduces it exactly (calibration per seed)."""
    return np.random.default_rng([seed, 8, seq, block])


def decoder_schedule(params: SynthParams, shape: TraceShape, seed: int = 0) -> tuple[int, int]:
    """(positions decoded, iterations summed over batch rows) of ``generate(params, shape, seed)``, without any
    routing: their ratio is the trace's tokens per forward (``synth_fit.Schedule.summary``)."""
    tokens = forwards = 0
    for n, seq in enumerate(shape.sequences):
        for i, (_, masked_rows, _) in enumerate(seq.blocks):
            masked = np.concatenate([np.arange(params.block_length) >= params.block_length - m for m in masked_rows])
            dec = _Decoder(params, decoder_rng(seed, n, i), masked, shape.batch)
            tokens += int(masked.sum())
            while dec.masked.any():
                start = dec.step()[0]
                forwards += int(start.reshape(shape.batch, -1).any(1).sum())
    return tokens, forwards


def shape_memory(params: SynthParams, shape: TraceShape) -> int:
    """Upper bound of the bytes ``generate(params, shape)`` holds (``synth_check.memory_bytes``): a block takes at
    most as many denoising forwards as its fullest row has masked positions (each commits at least one a row)."""
    rows, events, widest = 0, 0, 0
    B, batch = params.block_length, shape.batch
    for seq in shape.sequences:
        rows += seq.prompt_rows
        widest = max(widest, seq.prompt_rows, batch * B)
        for _, masked, refresh in seq.blocks:
            its = max(masked, default=0)
            rows += (its + int(refresh)) * batch * B
            events += its * batch * B
    return memory_bytes(params.num_layers, params.num_experts, params.top_k, rows, widest, events)


def popularity(params: SynthParams, layers: tuple[int, ...] | None = None) -> np.ndarray:
    """The static popularity g [len(layers), 1, E] of ``params.popularity_seed``: row l is layer l's whatever the
    number of layers (one stream, filled row by row), so a one-layer trace of layer l can use the g of layer l."""
    layers = tuple(range(params.num_layers)) if layers is None else layers
    rows = np.random.default_rng([params.popularity_seed, 2]).normal(size=(max(layers) + 1, 1, params.num_experts))
    return rows[list(layers)]


def generate(params: SynthParams, shape: TraceShape, seed: int = 0,
             bins: tuple[float, ...] | None = None, max_memory_gib: float = MAX_MEMORY_GIB,
             popularity_layers: tuple[int, ...] | None = None) -> Trace:
    """A synthetic trace with ``shape``'s skeleton and ``params``' decoder and router (deterministic per seed).

    ``params`` is checked field by field and the trace's memory estimated before anything is allocated.
    ``popularity_layers`` (one per layer of ``params``; default 0, 1, ...) picks the static popularity rows: the fit
    generates one-layer traces of layer l with row l, the popularity that layer has in the full trace."""
    from .routing_stats import CONFIDENCE_BINS

    params.check()
    check_int("seed", seed, 0)
    if popularity_layers is not None and (len(popularity_layers) != params.num_layers
                                          or any(not isinstance(x, int) or x < 0 for x in popularity_layers)):
        raise ValueError(f"popularity_layers: {popularity_layers!r}; allowed: {params.num_layers} layer indices >= 0")
    check_memory(shape_memory(params, shape), max_memory_gib,
                 f"{len(shape.sequences)} sequences x batch {shape.batch}, {shape.num_blocks} blocks at "
                 f"{params.num_layers} layers x {params.num_experts} experts, top-{params.top_k}, block "
                 f"{params.block_length}")
    bins = CONFIDENCE_BINS if bins is None else bins
    p, L, E, k, B = params, params.num_layers, params.num_experts, params.top_k, params.block_length
    rng = np.random.default_rng([seed, 1])
    g = popularity(params, popularity_layers)
    s = np.asarray(p.popularity_scale, dtype=np.float64).reshape(L, 1, 1)
    d = np.asarray(p.block_scale, dtype=np.float64).reshape(L, 1, 1)
    rho = np.asarray(p.block_carry, dtype=np.float64).reshape(L, 1, 1)
    carry = state_carry(p, bins)  # [states, L]
    pc = None if p.predict_carry is None else np.asarray(p.predict_carry, dtype=np.float64).reshape(L, 1, 1)
    a = np.zeros((L, 1, 1)) if p.mask_scale is None else np.asarray(p.mask_scale, dtype=np.float64).reshape(L, 1, 1)
    brng = np.random.default_rng([seed, 6])  # the mask component's own stream: mask_scale 0 leaves the rest as it was
    q = None if p.step_scale is None or not any(p.step_scale) else np.asarray(p.step_scale, float).reshape(L, 1, 1)
    zrng = np.random.default_rng([seed, 9])  # the within-block walk's own stream, likewise
    writer = TraceWriter(L, E, k, B, hidden_size=p.hidden_size, moe_intermediate_size=p.moe_intermediate_size,
                         dtype_bytes=p.dtype_bytes, model=f"synthetic ({p.source})" if p.source else "synthetic",
                         decoding={"threshold": p.threshold, "seed": seed})
    writer.header["batch_size"] = shape.batch

    def forward(kind: str, block: int, it: int, shared: np.ndarray, eps: np.ndarray) -> None:
        ids, w = _routes(shared + eps, k)
        pred = None
        if pc is not None:
            mixed = pc * eps + np.sqrt(1 - pc ** 2) * rng.normal(size=eps.shape)
            pids, pw = _routes(shared + mixed, k)
            pred = ([None] + list(pids[1:]), [None] + list(pw[1:]))
        writer.add_forward(kind, block, it, list(ids), list(w), pred)

    for n, seq in enumerate(shape.sequences):
        writer.begin_sequence(n)
        blk, mcomp = rng.normal(size=(L, 1, E)), brng.normal(size=(L, 1, E))
        forward("prefill", -1, -1, s * g + d * blk, rng.normal(size=(L, seq.prompt_rows, E)))
        for i, (block, masked_rows, refresh) in enumerate(seq.blocks):
            if i:
                blk = rho * blk + np.sqrt(1 - rho ** 2) * rng.normal(size=blk.shape)
                mcomp = rho * mcomp + np.sqrt(1 - rho ** 2) * brng.normal(size=mcomp.shape)
            shared = s * g + d * blk
            shared_m = shared + a * mcomp
            masked = np.concatenate([np.arange(B) >= B - m for m in masked_rows])
            tokens = np.where(masked, -1, rng.integers(0, 1000, size=masked.shape))
            eps = rng.normal(size=(L, masked.shape[0], E))
            writer.on_block_start(block, torch.from_numpy(tokens.reshape(shape.batch, B)))
            dec, it = _Decoder(p, decoder_rng(seed, n, i), masked, shape.batch), 0
            walk = np.zeros((L, 1, E))
            while dec.masked.any():
                if q is not None and it:
                    walk = walk + q * zrng.normal(size=(L, 1, E))
                forward("denoise", block, it, np.where(dec.masked[None, :, None], shared_m, shared) + walk, eps)
                start, conf, commit = dec.step()
                tokens[commit] = rng.integers(0, 1000, size=int(commit.sum()))
                writer.on_iteration(IterationEvent(block, it, *(torch.from_numpy(x.reshape(shape.batch, B).copy())
                                                                 for x in (start, conf, commit, tokens))))
                state = np.where(~start, 0, np.where(commit, 1, _bin_state(conf, bins)))
                c = carry[state].T[:, :, None]  # [L, T, 1]
                eps = c * eps + np.sqrt(np.maximum(1 - c ** 2, 0.0)) * rng.normal(size=eps.shape)
                it += 1
            if refresh:
                forward("refresh", block, it, shared + walk, eps)
            writer.on_block_end(block, torch.from_numpy(tokens.reshape(shape.batch, B).copy()))
    return writer.trace()
