"""Fit the synthetic generator (``synthetic.generate``) to a recorded trace, and compare the two.

``fit(trace)`` estimates :class:`~oled_hf.sim.synthetic.SynthParams` from a trace's statistics:

* **commit schedule** (per block and batch row): the share of masked positions committed in the first
  iteration gives the Beta of the sure share (method of moments); the hazard with which unsure positions
  become sure is found by bisection so that the simulated decoder needs the recorded iterations per block;
  unsure confidences give their Beta (moments) and per-iteration jitter (consecutive differences);
* **popularity and locality, per layer**: a fast routing-only simulation (same logits model as the
  generator) is solved by bisection, three rounds, for the shared scale ``sqrt(s^2 + d^2)`` (sets the
  distinct experts per iteration), the static share ``s^2 / (s^2 + d^2)`` (sets the popularity skew, the
  share of routes served by the layer's top 10% experts) and the block carry (sets the adjacent-iteration
  overlap across a block boundary);
* **set statistics, per layer** (``refine_sets``): the same bisections on generated one-layer traces of the
  recorded shape (decoder included, each layer with its own static popularity), adding the mask component's scale,
  solved for the cosine between the masked and the decoded tokens' expert counts within a step (masked tokens
  share experts that decoded ones do not), the carries re-solved after each round;
* **route persistence per token state** (decoded, committed, masked by confidence bin) and the predicted
  routes' accuracy, per layer: inverted through a table of persistence against the noise carry.

Every fitted figure is kept in ``params.targets``; ``compare`` lists each statistic on the recorded trace next
to the same statistic on a trace generated from the fitted parameters.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from ..offload.trace import OP_BLOCK_START, OP_EVENT, OP_FORWARD, Trace
from .routing_stats import CONFIDENCE_BINS, denoise_steps, expert_counts, routing_stats, state_labels
from .synthetic import STATES, SeqShape, SynthParams, TraceShape, _Decoder

TOP_SHARE = 0.10  # popularity skew: share of a layer's routes served by its top 10% experts


# ------------------------------------------------------------------------------------------------ trace facts
def trace_shape(trace: Trace) -> TraceShape:
    """The skeleton of a recorded trace: per sequence its prefill rows and per block the masked positions per
    batch row at the block's first iteration and whether a refresh forward follows (``generate`` replays it)."""
    seqs: dict[int, SeqShape] = {}
    order: list[int] = []
    batch, cur, block = 1, None, None
    for op, i in trace.ops():
        if op == OP_FORWARD:
            f = trace.forward(i)
            if f.kind == "prefill":
                cur = SeqShape(int(f.topk_ids.shape[1]), [])
                seqs[f.seq] = cur
                order.append(f.seq)
            elif f.kind == "refresh" and block is not None and block[1] is not None:
                block[2] = True
        elif op == OP_BLOCK_START:
            block = [int(trace.marker(i)[0]), None, False]
            if cur is not None:
                cur.blocks.append(block)  # type: ignore[arg-type]
        elif op == OP_EVENT and block is not None and block[1] is None:
            masked = trace.event(i).masked
            batch = int(masked.shape[0])
            block[1] = [int(x) for x in masked.sum(1).tolist()]
    out = []
    for s in order:
        blocks = [(int(b), list(m), bool(r)) for b, m, r in seqs[s].blocks if m is not None and sum(m) > 0]
        out.append(SeqShape(seqs[s].prompt_rows, blocks))
    return TraceShape(batch, out)


@dataclass
class Schedule:
    """Per (block, batch row): masked positions at the start, committed at the first iteration, iterations."""

    masked: np.ndarray
    first: np.ndarray
    iterations: np.ndarray
    unsure_conf: np.ndarray  # confidences of masked positions left uncommitted
    conf_steps: np.ndarray  # their change from one iteration to the next

    def summary(self) -> dict[str, float]:
        m = self.masked > 0
        return {"iterations per block": float(self.iterations[m].mean()),
                "first-iteration commit share": float((self.first[m] / self.masked[m]).mean()),
                "tokens per forward": float(self.masked[m].sum() / self.iterations[m].sum()),
                "blocks done in one iteration": float((self.iterations[m] == 1).mean())}


def schedule(trace: Trace) -> Schedule:
    """The commit schedule of every block row of ``trace`` (from its iteration events)."""
    masked, first, iters, unsure, steps = [], [], [], [], []
    prev = None
    for op, i in trace.ops():
        if op != OP_EVENT:
            continue
        ev = trace.event(i)
        m, c, conf = ev.masked.numpy(), ev.committed.numpy(), ev.confidence.numpy()
        if ev.iteration == 0:
            masked.extend(m.sum(1).tolist())
            first.extend(c.sum(1).tolist())
            iters.extend([0] * m.shape[0])
            prev = None
        rows = len(iters) - m.shape[0]
        for r in range(m.shape[0]):
            iters[rows + r] += int(m[r].any())
        left = m & ~c
        unsure.extend(conf[left].tolist())
        if prev is not None and prev[0].shape == m.shape:
            both = prev[0] & left
            steps.extend((conf[both] - prev[1][both]).tolist())
        prev = (left, conf)
    return Schedule(np.asarray(masked, float), np.asarray(first, float), np.asarray(iters, float),
                    np.asarray(unsure, float), np.asarray(steps, float))


def threshold_of(trace: Trace, sched: Schedule) -> float:
    """The decoder's threshold: the header's, else the 0.05 step at or above every uncommitted confidence."""
    t = (trace.header.get("decoding") or {}).get("threshold")
    if t is not None:
        return float(t)
    top = float(sched.unsure_conf.max()) if sched.unsure_conf.size else 0.9
    return min(1.0, math.ceil(top * 20) / 20)


def top_share(trace: Trace, share: float = TOP_SHARE) -> list[float]:
    """Per layer: the share of denoising routes that go to the layer's top ``share`` experts (popularity skew)."""
    a = trace.arrays
    rows = np.concatenate([np.arange(a["fwd_rows"][i], a["fwd_rows"][i + 1])
                           for i in np.flatnonzero(a["fwd_kind"] == 1)])
    top = max(1, math.ceil(share * trace.num_experts))
    out = []
    for layer in range(trace.num_layers):
        counts = np.sort(np.bincount(a["topk_ids"][layer, rows].reshape(-1).astype(np.int64),
                                     minlength=trace.num_experts))[::-1]
        out.append(float(counts[:top].sum() / max(counts.sum(), 1)))
    return out


def prediction_accuracy(trace: Trace) -> list[float | None]:
    """Per layer: the share of a token's true top-k its predicted top-k contains (None: no predictions)."""
    if not trace.has_predictions:
        return [None] * trace.num_layers
    ids, pred = trace.arrays["topk_ids"], trace.arrays["pred_ids"]
    out: list[float | None] = []
    for layer in range(trace.num_layers):
        if (pred[layer] < 0).all():
            out.append(None)
            continue
        out.append(float((pred[layer][:, :, None] == ids[layer][:, None, :]).any(-1).mean()))
    return out


# ------------------------------------------------------------------------------------------------ calibration
def _bisect(f: Callable[[float], float], target: float, lo: float, hi: float, increasing: bool,
            steps: int = 12) -> float:
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        if (f(mid) < target) == increasing:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _topk_sets(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k ids [..., T, k] of every token and the set of experts each step [..., E] routes to."""
    ids = np.argpartition(-logits, k - 1, axis=-1)[..., :k]
    flat = ids.reshape(-1, ids.shape[-2] * k)
    sets = np.zeros((flat.shape[0], logits.shape[-1]), dtype=bool)
    sets[np.arange(flat.shape[0])[:, None], flat] = True
    return ids, sets.reshape(logits.shape[:-2] + (logits.shape[-1],))


def route_stats(s: float, d: float, rho: float, E: int, k: int, B: int, n_seq: int = 40, n_blk: int = 6,
                seed: int = 0) -> tuple[float, float, float]:
    """(distinct experts per step, overlap across a block boundary, top-10% share) of the logits model."""
    rng = np.random.default_rng([seed, 3])
    g = rng.normal(size=(1, 1, 1, E))
    b = np.empty((n_seq, n_blk, 1, E))
    b[:, 0] = rng.normal(size=(n_seq, 1, E))
    for j in range(1, n_blk):
        b[:, j] = rho * b[:, j - 1] + math.sqrt(1 - rho ** 2) * rng.normal(size=(n_seq, 1, E))
    ids, sets = _topk_sets(s * g + d * b + rng.normal(size=(n_seq, n_blk, B, E)), k)
    inter = (sets[:, :-1] & sets[:, 1:]).sum(-1) / np.maximum(sets[:, 1:].sum(-1), 1)
    counts = np.sort(np.bincount(ids.reshape(-1), minlength=E))[::-1]
    return float(sets.sum(-1).mean()), float(inter.mean()), float(counts[:max(1, math.ceil(TOP_SHARE * E))].sum()
                                                                   / counts.sum())


def fit_layer(distinct: float, across: float, skew: float, E: int, k: int, B: int,
              rounds: int = 3) -> tuple[float, float, float]:
    """(popularity scale s, block scale d, block carry rho) reproducing one layer's three statistics."""
    t, phi, rho = 1.5, 0.5, 0.5

    def sd(t_: float, phi_: float) -> tuple[float, float]:
        return t_ * math.sqrt(phi_), t_ * math.sqrt(1 - phi_)

    for _ in range(rounds):
        t = _bisect(lambda x, f=phi, r=rho: route_stats(*sd(x, f), r, E, k, B)[0], distinct, 0.0, 8.0, False)
        phi = _bisect(lambda x, t_=t, r=rho: route_stats(*sd(t_, x), r, E, k, B)[2], skew, 0.0, 1.0, True)
        rho = _bisect(lambda x, t_=t, f=phi: route_stats(*sd(t_, f), x, E, k, B)[1], across, 0.0, 0.999, True)
    s, d = sd(t, phi)
    return s, d, rho


CARRY_GRID = np.concatenate([np.linspace(0.0, 0.9, 19), np.linspace(0.91, 1.0, 10)])


def persistence_table(s: float, d: float, E: int, k: int, tokens: int = 1024, seed: int = 0,
                      before: float = 0.0, after: float = 0.0, step: float = 0.0) -> np.ndarray:
    """Route persistence (share of top-k kept) at each carry of ``CARRY_GRID``, for one layer's scales, the mask
    component's scale before and after the step (a masked token: a, a; a commit: a, 0; decoded: 0, 0) and the
    within-block walk's step scale (the second step's logits move by ``step`` * N(0, 1))."""
    rng = np.random.default_rng([seed, 4])
    g, bm, mc = rng.normal(size=(1, E)), rng.normal(size=(tokens, E)), rng.normal(size=(tokens, E))
    shared = s * g + d * bm + before * mc
    after_ = s * g + d * bm + after * mc
    if step:
        after_ = after_ + step * np.random.default_rng([seed, 10]).normal(size=(tokens, E))
    eps, fresh = rng.normal(size=(tokens, E)), rng.normal(size=(tokens, E))
    a = np.argpartition(-(shared + eps), k - 1, axis=-1)[:, :k]
    out = []
    for c in CARRY_GRID:
        b = np.argpartition(-(after_ + c * eps + math.sqrt(max(1 - c * c, 0.0)) * fresh), k - 1, axis=-1)[:, :k]
        out.append((a[:, :, None] == b[:, None, :]).any(-1).mean())
    return np.maximum.accumulate(np.asarray(out))


def invert(table: np.ndarray, target: float) -> float:
    """The carry whose persistence is ``target`` (clamped to the table's range)."""
    return float(np.interp(target, table, CARRY_GRID))


def fit_carry(pers: dict, scales: list[tuple[float, float, float]], mask: list[float], E: int,
              k: int, step: list[float] | None = None) -> dict[str, list[float]]:
    """Per token state and layer: the noise carry whose persistence is the recorded one (masked tokens also carry
    the mask component, scale ``mask[l]``, which a commit drops; every token the within-block walk, step scale
    ``step[l]``); an empty confidence bin borrows its nearest."""
    step = [0.0] * len(scales) if step is None else step
    tabs = {kind: [persistence_table(s, d, E, k, before=a if kind != "decoded" else 0.0,
                                     after=a if kind == "masked" else 0.0, step=z)
                   for (s, d, _), a, z in zip(scales, mask, step)]
            for kind in ("decoded", "committed", "masked")}
    labels = state_labels(CONFIDENCE_BINS)
    masked_labels = [x for x in labels if x not in STATES]
    carry: dict[str, list[float]] = {}
    for label in labels:
        per_layer = pers[label]["per_layer"]
        if all(v is None for v in per_layer):
            near = min((x for x in masked_labels if pers[x]["per_layer"][0] is not None),
                       key=lambda x: abs(masked_labels.index(x) - masked_labels.index(label))
                       if label in masked_labels else 0)
            per_layer = pers[near]["per_layer"]
        tab = tabs[label if label in STATES else "masked"]
        carry[label] = [invert(tab[l], v if v is not None else 0.5) for l, v in enumerate(per_layer)]
    return carry


def fit_predict(acc: list[float | None], scales: list[tuple[float, float, float]], E: int, k: int,
                mask: list[float] | None = None, masked_share: float = 0.0) -> list[float] | None:
    """Per layer: the carry of the predicted routes' noise that gives the recorded prediction accuracy (its table
    averaged over masked tokens, with the mask component, and decoded ones, by their share of denoised rows)."""
    if all(a is None for a in acc):
        return None
    mask = [0.0] * len(acc) if mask is None else mask
    out = []
    for (s, d, _), a, m in zip(scales, acc, mask):
        table = ((1 - masked_share) * persistence_table(s, d, E, k)
                 + masked_share * persistence_table(s, d, E, k, before=m, after=m))
        out.append(1.0 if a is None else invert(np.maximum.accumulate(table), a))
    return out


# ------------------------------------------------------------------------------------------------ set statistics
def mixed_cosine(trace: Trace) -> list[float]:
    """Per layer: the cosine, within one denoising step, between the expert counts of its masked tokens and those of
    its decoded ones (mean over steps that have both; NaN: none has). The mask component's own signature: 0 shared
    logits apart, near 1 without it at many tokens; recorded toys 0.2-0.5 (masked tokens share experts of their own)."""
    E = trace.num_experts
    sums, n = np.zeros(trace.num_layers), 0
    for step in denoise_steps(trace):
        if step.masked.all() or not step.masked.any():
            continue
        a = expert_counts(step.topk_ids[:, step.masked], E).astype(float)
        b = expert_counts(step.topk_ids[:, ~step.masked], E).astype(float)
        sums += (a * b).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-12)
        n += 1
    return [float(x) for x in sums / n] if n else [float("nan")] * trace.num_layers


def layer_targets(trace: Trace) -> dict[str, list[float]]:
    """Per layer, the set statistics ``refine_sets`` matches: distinct experts per step and per block (union over
    its steps), overlap and activation cosine across a block boundary, top-10% share, masked/decoded cosine."""
    st = routing_stats(trace)
    mean = [float(np.mean(v)) if len(v) else float("nan") for v in st.cosine_across]
    return {"distinct": [float(np.mean(v)) for v in st.distinct], "across": [float(np.mean(v)) if len(v) else 0.5
                                                                            for v in st.across],
            "cosine across": mean, "skew": top_share(trace), "mixed cosine": mixed_cosine(trace),
            "block distinct": [float(np.mean(v)) if len(v) else float("nan") for v in st.block_distinct]}


def _one_layer(p: SynthParams, l: int) -> SynthParams:
    return replace(p, num_layers=1, popularity_scale=p.popularity_scale[l:l + 1], block_scale=p.block_scale[l:l + 1],
                   block_carry=p.block_carry[l:l + 1], carry={s: v[l:l + 1] for s, v in p.carry.items()},
                   predict_carry=None, mask_scale=None if p.mask_scale is None else p.mask_scale[l:l + 1],
                   step_scale=None if p.step_scale is None else p.step_scale[l:l + 1])


@dataclass
class LayerFit:
    """One layer's router parameters while ``refine_sets`` solves them: shared scale t = hypot(s, d), static share
    phi = s^2 / t^2, block carry rho, mask scale a, within-block step scale z."""

    t: float
    phi: float
    rho: float
    a: float
    z: float

    @classmethod
    def of(cls, p: SynthParams, l: int) -> LayerFit:
        t = math.hypot(p.popularity_scale[l], p.block_scale[l])
        return cls(t, p.popularity_scale[l] ** 2 / max(t * t, 1e-12), p.block_carry[l],
                   (p.mask_scale or [0.0] * p.num_layers)[l], (p.step_scale or [0.0] * p.num_layers)[l])

    def store(self, p: SynthParams, l: int) -> None:
        p.popularity_scale[l], p.block_scale[l] = self.t * math.sqrt(self.phi), self.t * math.sqrt(1 - self.phi)
        p.block_carry[l], p.mask_scale[l], p.step_scale[l] = self.rho, self.a, self.z  # type: ignore[index]


def _layer_stat(p: SynthParams, l: int, shape: TraceShape, name: str, x: LayerFit) -> float:
    """One statistic of layer ``l`` on a one-layer trace generated with ``x`` and the layer's current carries and
    its own static popularity row (as in the full trace)."""
    from .synthetic import generate

    q = _one_layer(p, l)
    q.popularity_scale, q.block_scale = [x.t * math.sqrt(x.phi)], [x.t * math.sqrt(1 - x.phi)]
    q.block_carry, q.mask_scale, q.step_scale = [x.rho], [x.a], [x.z]
    return layer_targets(generate(q, shape, seed=17, popularity_layers=(l,)))[name][0]


def _solve(f: Callable[[float], float], target: float, lo: float, hi: float, increasing: bool,
           steps: int) -> float:
    """``_bisect``, except that ``lo`` itself is the answer when ``f(lo)`` is already at or past the target (a
    component the trace does not need comes back as 0, not as the bisection's smallest step)."""
    if (f(lo) >= target) == increasing:
        return lo
    return _bisect(f, target, lo, hi, increasing, steps)


def _refit_layer_carry(p: SynthParams, pers: dict, l: int) -> None:
    """Layer ``l``'s carries re-solved for its current scales (in place): the statistics the next bisection
    simulates depend on them, and the mask component and the walk lower route persistence at a given carry."""
    one = {key: {**v, "per_layer": v["per_layer"][l:l + 1]} for key, v in pers.items()}
    got = fit_carry(one, [(p.popularity_scale[l], p.block_scale[l], p.block_carry[l])], [p.mask_scale[l]],
                    p.num_experts, p.top_k, [p.step_scale[l]])
    for state, v in got.items():
        p.carry[state][l] = v[0]


def refine_sets(p: SynthParams, shape: TraceShape, targets: dict[str, list[float]], pers: dict,
                rounds: int = 2, steps: int = 9) -> None:
    """Per layer, on generated one-layer traces of the recorded shape (the decoder included, which route_stats
    leaves out; the layer's own static popularity): coordinate bisection of the mask scale (cosine of masked and
    decoded tokens' counts in one step: the mask component alone moves it; solved on the cosine across blocks
    instead, it traded off against the block carry and came back as 1.04 on a trace generated without one), shared
    scale (distinct experts per step), static share (skew) and block carry (overlap across blocks); the layer's
    carries are re-solved after each round, since the next round's simulations use them. In place.

    The within-block walk (``step_scale``) is not fitted: solved for the distinct experts per block (union over a
    block's steps) it reached its bound (3.0) on the long toy's third layer and the coordinate descent collapsed
    (mask scale 6, popularity scale 0.008); a given step scale is kept and the carries account for it."""
    L = p.num_layers
    p.mask_scale = [0.0] * L if p.mask_scale is None else list(p.mask_scale)
    p.step_scale = [0.0] * L if p.step_scale is None else list(p.step_scale)
    p.carry = {key: list(v) for key, v in p.carry.items()}

    def stat(l: int, name: str, x: LayerFit, field: str) -> Callable[[float], float]:
        return lambda v: _layer_stat(p, l, shape, name, replace(x, **{field: v}))

    for l in range(L):
        x = LayerFit.of(p, l)
        for _ in range(rounds):
            if not math.isnan(targets["mixed cosine"][l]):
                x.a = _solve(stat(l, "mixed cosine", x, "a"), targets["mixed cosine"][l], 0.0, 6.0, False, steps)
            x.t = _bisect(stat(l, "distinct", x, "t"), targets["distinct"][l], 0.0, 8.0, False, steps)
            x.phi = _bisect(stat(l, "skew", x, "phi"), targets["skew"][l], 0.0, 1.0, True, steps)
            x.rho = _bisect(stat(l, "across", x, "rho"), targets["across"][l], 0.0, 0.999, True, steps)
            x.store(p, l)
            _refit_layer_carry(p, pers, l)


# ------------------------------------------------------------------------------------------------ the fit
def _fill(values: list[float | None], fallback: float) -> list[float]:
    return [fallback if v is None else float(v) for v in values]


def fit(trace: Trace, source: str = "", refine: bool = True) -> SynthParams:
    """Estimate the generator's parameters from a recorded trace (see the module docstring)."""
    h, L, E = trace.header, trace.num_layers, trace.num_experts
    k, B = int(h["top_k"]), int(h["block_length"])
    sched = schedule(trace)
    thr = threshold_of(trace, sched)
    m = sched.masked >= 2
    f0 = sched.first[m] / sched.masked[m]
    mean, var = float(f0.mean()), float(f0.var())
    common = max(mean * (1 - mean) / max(var, 1e-6) - 1, 0.05)
    alpha, beta = max(mean * common, 0.02), max((1 - mean) * common, 0.02)
    u = np.clip(sched.unsure_conf / thr, 1e-3, 1 - 1e-3)
    um, uv = float(u.mean()) if u.size else 0.5, float(u.var()) if u.size else 0.05
    uc = max(um * (1 - um) / max(uv, 1e-6) - 1, 0.1)
    jitter = float(sched.conf_steps.std() / math.sqrt(2)) if sched.conf_steps.size else 0.05
    stats = routing_stats(trace).summary()
    distinct = _fill(stats["distinct_experts_per_iteration"]["per_layer"], k * B / 2)
    across = _fill(stats["overlap_across_blocks"]["per_layer"], 0.5)
    skew = top_share(trace)
    scales = [fit_layer(distinct[l], across[l], skew[l], E, k, B) for l in range(L)]
    pers = stats["persistence_by_state"]
    carry = fit_carry(pers, scales, [0.0] * L, E, k)
    acc = prediction_accuracy(trace)
    params = SynthParams(
        num_layers=L, num_experts=E, top_k=k, block_length=B, popularity_scale=[s for s, _, _ in scales],
        block_scale=[d for _, d, _ in scales], block_carry=[r for _, _, r in scales], carry=carry,
        predict_carry=fit_predict(acc, scales, E, k), threshold=thr, sure_alpha=alpha, sure_beta=beta, hazard=0.1,
        conf_alpha=max(um * uc, 0.05), conf_beta=max((1 - um) * uc, 0.05), conf_jitter=jitter,
        hidden_size=int(h.get("hidden_size") or 0), moe_intermediate_size=int(h.get("moe_intermediate_size") or 0),
        dtype_bytes=int(h.get("dtype_bytes", 2)), source=source or "fitted",
        targets={"distinct_per_iteration": distinct, "overlap_across_blocks": across, "top10_share": skew,
                 "prediction_accuracy": acc, **sched.summary()})
    params.hazard = fit_hazard(params, sched)
    if refine:
        targets = layer_targets(trace)
        refine_sets(params, trace_shape(trace), targets, pers)
        for key, name in (("activation_cosine_across_blocks", "cosine across"),
                          ("distinct_per_block", "block distinct"), ("masked_decoded_cosine", "mixed cosine")):
            params.targets[key] = targets[name]
        masked = sum(v["tokens"] for key, v in pers.items() if key != "decoded")
        params.predict_carry = fit_predict(acc, list(zip(params.popularity_scale, params.block_scale,
                                                         params.block_carry)), E, k, params.mask_scale,
                                           masked / max(masked + pers["decoded"]["tokens"], 1))
    return params


def simulate_schedule(params: SynthParams, masked: np.ndarray, seed: int = 0) -> Schedule:
    """The decoder alone over blocks with these masked counts (one row each): its iterations per block."""
    rng = np.random.default_rng([seed, 5])
    B = params.block_length
    first, iters = [], []
    for m in masked.astype(int):
        dec = _Decoder(params, rng, np.arange(B) >= B - m, 1)
        n, c0 = 0, 0
        while dec.masked.any():
            c = int(dec.step()[2].sum())
            c0 = c if n == 0 else c0
            n += 1
        first.append(c0)
        iters.append(n)
    empty = np.zeros(0)
    return Schedule(masked.astype(float), np.asarray(first, float), np.asarray(iters, float), empty, empty)


def fit_hazard(params: SynthParams, sched: Schedule) -> float:
    """The hazard that gives the recorded mean iterations per block on the recorded masked counts."""
    target = float(sched.iterations[sched.masked > 0].mean())
    masked = np.repeat(sched.masked[sched.masked > 0], max(1, 400 // max(len(sched.masked), 1)))

    def iters(hz: float) -> float:
        params.hazard = hz
        return float(simulate_schedule(params, masked).iterations.mean())

    return _bisect(iters, target, 0.0, 1.0, increasing=False, steps=10)


# ------------------------------------------------------------------------------------------------ comparison
def describe(trace: Trace) -> dict[str, list[float | None] | float | None]:
    """The statistics the fit targets (and a few it does not), per layer where they vary."""
    s = routing_stats(trace).summary()
    out: dict[str, list[float | None] | float | None] = dict(schedule(trace).summary())
    out["distinct experts per iteration"] = s["distinct_experts_per_iteration"]["per_layer"]
    out["activation ratio per block"] = s["activation_ratio_per_block"]
    out["top-10% expert share (skew)"] = top_share(trace)
    out["overlap within block"] = s["overlap_within_block"]["per_layer"]
    out["overlap across blocks"] = s["overlap_across_blocks"]["per_layer"]
    out["activation cosine within block"] = s["activation_cosine_within_block"]
    out["activation cosine across blocks"] = s["activation_cosine_across_blocks"]
    for state, v in s["persistence_by_state"].items():
        if v["tokens"]:
            out[f"persistence: {state}"] = v["mean"]
    acc = [a for a in prediction_accuracy(trace) if a is not None]
    out["next-layer prediction accuracy"] = float(np.mean(acc)) if acc else None
    return out


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, list):
        return " ".join("-" if x is None else f"{x:.3g}" for x in v)
    return f"{v:.3g}"


def compare(real: Trace, synth: Trace) -> list[tuple[str, str, str, str]]:
    """Rows (statistic, recorded, regenerated, relative error of the mean) for ``format_compare``."""
    a, b = describe(real), describe(synth)
    rows = []
    for key in a:
        x, y = a[key], b.get(key)

        def mean(v):
            vals = [u for u in (v if isinstance(v, list) else [v]) if u is not None]
            return float(np.mean(vals)) if vals else None

        mx, my = mean(x), mean(y)
        err = f"{(my - mx) / mx:+.1%}" if mx and my is not None else "-"
        rows.append((key, _fmt(x), _fmt(y), err))
    return rows


def format_compare(rows: list[tuple[str, str, str, str]], left: str = "recorded",
                   right: str = "regenerated") -> str:
    w = max(len(r[0]) for r in rows)
    wx = max(len(left), *(len(r[1]) for r in rows))
    wy = max(len(right), *(len(r[2]) for r in rows))
    lines = [f"{'statistic (per layer where several)':<{w}}  {left:<{wx}}  {right:<{wy}}  error of mean"]
    lines += [f"{r[0]:<{w}}  {r[1]:<{wx}}  {r[2]:<{wy}}  {r[3]}" for r in rows]
    return "\n".join(lines)
