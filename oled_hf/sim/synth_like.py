"""Synthetic workloads at a published model's figures (``oled-moe trace synth --like NAME``).

No recorded trace of LLaDA2.0-mini or -flash exists here, so their workloads come from the generator
(``synthetic.generate``) set to the published figures and, where nothing is published, to the long-answer
toy's fitted values (``synth_fit.fit`` on ``traces/dev/long-b16-bs1.trace``, copied below). Calibration:

1. the shared logit scale is solved so a block step routes the published distinct experts (static share and
   block carry kept at the toy's);
2. every state's noise carry is moved towards 1 by one factor, ``carry = 1 - f (1 - toy carry)``, solved so
   adjacent iterations' activation cosine is the published one;
3. the sure share of the decoder is solved so a block decodes at the assumed tokens per forward.

Every figure is listed in ``params.assumptions`` with its source, measured or assumed; the CLI prints them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .routing_stats import routing_stats, state_labels
from .synth_fit import _bisect, route_stats, simulate_schedule
from .synthetic import SynthParams, TraceShape, decoder_schedule, generate

TOY_SOURCE = "assumed: the long-answer toy's value fitted on traces/dev/long-b16-bs1.trace (synth_fit.fit)"
# fitted on traces/dev/long-b16-bs1.trace (3 MoE layers x 256, block 16, threshold 0.95), layer means
TOY = {"static_share": 0.21, "block_carry": 0.75, "predict_carry": 0.755, "sure_alpha": 1.263, "sure_beta": 0.417,
       "hazard": 0.140, "conf_alpha": 1.029, "conf_beta": 1.114, "conf_jitter": 0.076,
       "carry": {"decoded": 0.9903, "committed": 0.2712, "masked 0.00-0.20": 0.9877, "masked 0.20-0.40": 0.9708,
                 "masked 0.40-0.60": 0.9792, "masked 0.60-0.80": 0.9774, "masked 0.80-0.90": 0.9546,
                 "masked 0.90-0.95": 0.8891, "masked 0.95-1.00": 0.8891}}


@dataclass(frozen=True)
class Published:
    """A model's routing shape and the published (or assumed) figures its workload is set to."""

    name: str
    num_layers: int
    num_experts: int
    top_k: int
    block_length: int
    hidden_size: int
    moe_intermediate_size: int
    distinct_per_step: float
    activation_cosine: float
    tokens_per_forward: float
    threshold: float
    sources: tuple[tuple[str, str], ...]  # (figure, source), in print order


MINI_CONFIG = "shared/data/llada2.0-mini/config.json"
LIKE = {
    "llada2.0-mini": Published(
        "llada2.0-mini", 19, 256, 8, 32, 2048, 512, 69.5, 0.985, 3.5, 0.95, (
            ("19 MoE layers x 256 experts, top-8", f"{MINI_CONFIG}: num_hidden_layers 20, first_k_dense_replace 1, "
                                                   "num_experts 256, num_experts_per_tok 8"),
            ("expert 2048 x 512, bf16", f"{MINI_CONFIG}: hidden_size, moe_intermediate_size, dtype"),
            ("block 32", "shared/docs/peers.md and llada2.md: block_length=32 (model card, TIDE main.py)"),
            ("threshold 0.95", "shared/docs/llada2.md: HF generate default threshold=0.95"),
            ("69.5 distinct experts per block step", "dMoE, arXiv 2605.30876 (shared/docs/peers.md)"),
            ("activation cosine 0.985 between adjacent steps", "TIDE, arXiv 2605.20179 (shared/docs/peers.md)"),
            ("3.5 tokens per forward", "assumed: the middle of 'about 2-5 tokens per forward' for LLaDA2.x on real "
                                       "text; not published per block for mini"),
            ("same distinct experts in every layer", "assumed: the paper's per-layer activation ratios (OLED "
                                                    "Figure 10c) are not published as numbers here"),
        )),
    "llada2.0-flash": Published(
        "llada2.0-flash", 31, 256, 8, 32, 4096, 1024, 69.5, 0.985, 3.5, 0.95, (
            ("31 MoE layers x 256 experts, top-8", "assumed: not in shared/docs; Ling-flash-2.0's architecture "
                                                   "(32 layers, first dense, 256 routed experts, top-8), from "
                                                   "memory of its public config, unverified offline"),
            ("expert 4096 x 1024, bf16", "oled_hf/sim/hardware.py MODEL_SHAPES (its cited llada2.md does not "
                                         "state flash's sizes: assumed)"),
            ("block 32", "assumed: mini's (shared/docs/llada2.md; both LLaDA2.0 models share the decoder)"),
            ("threshold 0.95", "assumed: the HF generate default (shared/docs/llada2.md)"),
            ("69.5 distinct experts per block step", "assumed: mini's figure (dMoE, arXiv 2605.30876); none "
                                                     "published for flash here"),
            ("activation cosine 0.985 between adjacent steps", "assumed: mini's figure (TIDE, arXiv 2605.20179); "
                                                               "TIDE targets flash too, its figure is not in "
                                                               "shared/docs"),
            ("3.5 tokens per forward", "assumed: as for mini (about 2-5 tokens per forward)"),
            ("same distinct experts in every layer", "assumed: no per-layer figures published"),
        )),
}


def like_names() -> list[str]:
    return sorted(LIKE)


def _toy_params(pub: Published, num_layers: int, scale: float, carry_factor: float) -> SynthParams:
    phi = TOY["static_share"]
    L = num_layers
    carry = {s: [1 - carry_factor * (1 - c)] * L for s, c in TOY["carry"].items()}
    return SynthParams(
        num_layers=L, num_experts=pub.num_experts, top_k=pub.top_k, block_length=pub.block_length,
        popularity_scale=[scale * math.sqrt(phi)] * L, block_scale=[scale * math.sqrt(1 - phi)] * L,
        block_carry=[TOY["block_carry"]] * L, carry=carry, predict_carry=[1.0] + [TOY["predict_carry"]] * (L - 1),
        threshold=pub.threshold, sure_alpha=TOY["sure_alpha"], sure_beta=TOY["sure_beta"], hazard=TOY["hazard"],
        conf_alpha=TOY["conf_alpha"], conf_beta=TOY["conf_beta"], conf_jitter=TOY["conf_jitter"],
        hidden_size=pub.hidden_size, moe_intermediate_size=pub.moe_intermediate_size, dtype_bytes=2,
        source=f"like {pub.name}")


def like(name: str, distinct: float | None = None, cosine: float | None = None) -> SynthParams:
    """Parameters at ``name``'s published figures (``distinct``/``cosine`` override them, for sweeps)."""
    if name not in LIKE:
        raise ValueError(f"--like {name}: unknown; allowed: {', '.join(like_names())}")
    pub = LIKE[name]
    distinct = pub.distinct_per_step if distinct is None else float(distinct)
    cosine = pub.activation_cosine if cosine is None else float(cosine)
    E, k, B, phi, rho = pub.num_experts, pub.top_k, pub.block_length, TOY["static_share"], TOY["block_carry"]
    scale = _bisect(lambda t: route_stats(t * math.sqrt(phi), t * math.sqrt(1 - phi), rho, E, k, B)[0], distinct,
                    0.0, 8.0, increasing=False)
    shape = TraceShape.uniform(6, 3, B)

    def cos_at(f: float) -> float:
        s = routing_stats(generate(_toy_params(pub, 1, scale, f), shape, seed=11)).summary()
        return float(s["activation_cosine_within_block"])

    factor = _bisect(cos_at, cosine, 0.0, 1.5, increasing=False, steps=10)
    params = _toy_params(pub, pub.num_layers, scale, factor)
    total = TOY["sure_alpha"] + TOY["sure_beta"]
    masked = np.full(200, float(B))

    def tpf(mean: float) -> float:
        params.sure_alpha, params.sure_beta = max(mean * total, 1e-3), max((1 - mean) * total, 1e-3)
        return B / float(simulate_schedule(params, masked).iterations.mean())

    tpf(_bisect(tpf, pub.tokens_per_forward, 0.0, 1.0, increasing=True, steps=12))
    params.assumptions = [f"{figure}: {source}" for figure, source in pub.sources]
    if distinct != pub.distinct_per_step or cosine != pub.activation_cosine:
        params.assumptions.append(f"swept: {distinct:g} distinct experts per step, activation cosine {cosine:g} "
                                  f"(instead of {pub.distinct_per_step:g} / {pub.activation_cosine:g})")
    params.assumptions += [
        f"static popularity share {phi:g} of the shared logit variance: {TOY_SOURCE}",
        f"block carry {rho:g} (sets the overlap across a block boundary): {TOY_SOURCE}",
        f"route persistence by token state (decoded, committed, masked by confidence): {TOY_SOURCE}, each carry "
        f"moved towards 1 by factor {factor:.3f} to reach the activation cosine",
        f"decoder: sure-share Beta sum, unsure hazard {TOY['hazard']:g} (trace synth recalibrates it per seed: "
        f"calibrate_decoder), confidence Beta and jitter: {TOY_SOURCE}",
        f"next-layer prediction carry {TOY['predict_carry']:g}: {TOY_SOURCE}",
    ]
    across = route_stats(params.popularity_scale[0], params.block_scale[0], rho, E, k, B)[1]
    params.assumptions.append(f"cross-block overlap {across:.3f} (share of a block's first step's experts the "
                              f"previous block's last step used): set by the toy's block carry {rho:g} "
                              "(routing model, synth_fit.route_stats), not published")
    params.targets = {"distinct_per_step": distinct, "activation_cosine": cosine, "overlap_across_blocks": across,
                      "tokens_per_forward": pub.tokens_per_forward, "state_labels": state_labels()}
    return params


# ------------------------------------------------------------------------------------------------ stated figures
TOLERANCE = 0.05  # every stated figure is met within +-5% on every seed
FIGURES = (  # (name printed, params.targets key, synth_fit.describe key)
    ("tokens per forward", "tokens_per_forward", "tokens per forward"),
    ("distinct experts per block step", "distinct_per_step", "distinct experts per iteration"),
    ("activation cosine between adjacent steps", "activation_cosine", "activation cosine within block"),
    ("cross-block overlap", "overlap_across_blocks", "overlap across blocks"),
)


def calibrate_decoder(params: SynthParams, shape: TraceShape, seed: int) -> float:
    """Set ``params.hazard`` so ``generate(params, shape, seed)`` decodes at the stated tokens per forward.

    Why per seed and shape: a block's commit schedule is random (its sure share is a Beta draw), and over the ~100
    blocks of a trace the tokens per forward of seeds 1-5 spread 3.13-3.71 around 3.5. The decoder has its own
    stream per block (``synthetic.decoder_rng``), so ``decoder_schedule`` is the trace's exact schedule and the
    bisection is on the trace itself, not on a sample of it. Returns the achieved tokens per forward."""
    target = float(params.targets["tokens_per_forward"])

    def tpf(h: float) -> float:
        params.hazard = h
        tokens, forwards = decoder_schedule(params, shape, seed)
        return tokens / max(forwards, 1)

    params.hazard = _bisect(tpf, target, 0.0, 1.0, increasing=True, steps=18)
    got = tpf(params.hazard)
    params.assumptions.append(f"unsure hazard {params.hazard:.4f}: calibrated for seed {seed} and this trace's "
                              f"{shape.num_blocks} blocks to the stated {target:g} tokens per forward")
    return got


def figures(params: SynthParams, trace) -> list[tuple[str, float, float]]:
    """(figure, stated target, achieved on ``trace``) for every figure ``like`` states (layer means)."""
    from .synth_fit import describe

    d = describe(trace)
    out = []
    for name, key, stat in FIGURES:
        if key in params.targets:
            v = d[stat]
            vals = [x for x in (v if isinstance(v, list) else [v]) if x is not None]
            # A figure the trace cannot show (e.g. no layer has two blocks) is reported as NaN, not averaged.
            achieved = float(np.mean(vals)) if vals else float("nan")
            out.append((name, float(params.targets[key]), achieved))
    return out


def format_figures(rows: list[tuple[str, float, float]], tol: float = TOLERANCE) -> str:
    return "\n".join(f"  {name}: target {t:.4g}, not measurable on this trace" if np.isnan(a) else
                     f"  {name}: target {t:.4g}, achieved {a:.4g} ({(a - t) / t:+.1%}"
                     f"{'' if abs(a - t) <= tol * abs(t) else f', OUTSIDE +-{tol:.0%}'})" for name, t, a in rows)
