"""OLED: confidence-guided expert retention for block-diffusion decoding (the default policy).

Why it works. Adjacent denoising iterations route almost the same experts, but not uniformly so:
a token whose identity is settled (decoded earlier, committed now, or masked with a confident
prediction) keeps its hidden state, hence its routes, across iterations; an unsure masked token's
prediction is still moving and so are its routes. An expert used by settled tokens is therefore
likely to be requested again next iteration; one used only by unsure tokens is not. OLED ranks
experts by that likelihood instead of by recency or frequency.

The rule, per MoE layer access (rows = batch*B block positions, row r = batch r//B, position r%B):

1. Each row gets a stability class from the latest iteration event: decoded earlier, committed in
   the last iteration, masked & confident (p >= threshold), masked & unsure (4 confidence bins),
   fresh (a new block's first iteration: no confidence yet), or stable (prefill / KV-refresh /
   prompt rows, whose count differs from the block's, and everything before the first event).
2. A class's stability s is the probability that a route of such a row survives into the next
   iteration. Priors follow the method (settled = 1, confident ~ 0.95, unsure ~ its confidence with
   a floor > 0, fresh = 0.3) and are *calibrated online per layer* by measuring route persistence
   between consecutive forwards of the same block (a Beta-style blend with the prior as 64 pseudo
   rows). Real models need this: e.g. a confident masked token is committed next iteration and its
   input embedding changes from [MASK] to the token, which can move its early-layer routes.
3. Priority: ``score_e <- decay * score_e + sum_{routes r->e} s_r * g_re``, with ``g`` the row's gate
   weights raised to ``gate_power`` and renormalised (a route far above the top-k cut is more
   likely to survive; the power keeps the gate from overriding stability). The decayed history
   keeps experts of stable tokens resident through an iteration that happens not to use them.
4. Predicted reuse (for copy vs CPU): ``p_e = 1 - prod_r (1 - s_r)`` is the chance the expert is
   requested next iteration; reuse = ``p / (1 - p)``, the expected run of consecutive reuses.
5. Block boundaries: at a new block the previous block's tokens become prefix and stop routing, so
   its scores are decayed hard (``block_decay``); the new block's rows are "fresh" (uniform, low).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import MAX_REUSE, CachePolicy, as_numpy, register

STABLE, DECODED, COMMITTED, CONFIDENT, UNSURE, FRESH = 0, 1, 2, 3, 4, 8  # UNSURE..UNSURE+3 = bins
N_BINS = 4
N_CLASSES = 9


@register
class OledPolicy(CachePolicy):
    """Confidence-guided retention with online-calibrated per-class route stability."""

    name = "oled"
    tracks_usage = False

    def __init__(
        self,
        num_layers: int,
        num_experts: int,
        confidence_threshold: float = 0.9,
        decay: float = 0.5,
        block_decay: float = 0.25,
        min_stability: float = 0.05,
        gate_power: float = 0.5,
        calibrate: bool = True,
        prior_rows: float = 64.0,
        calibration_decay: float = 0.98,
        **knobs: Any,
    ) -> None:
        super().__init__(num_layers, num_experts, **knobs)
        self.threshold = float(confidence_threshold)
        self.decay = float(decay)
        self.block_decay = float(block_decay)
        self.min_stability = float(min_stability)
        self.gate_power = float(gate_power)
        self.calibrate = bool(calibrate)
        self.prior_rows = float(prior_rows)
        self.calibration_decay = float(calibration_decay)
        centres = self.threshold * (np.arange(N_BINS) + 0.5) / N_BINS
        prior = np.empty(N_CLASSES)
        prior[[STABLE, DECODED, COMMITTED, CONFIDENT, FRESH]] = [1.0, 1.0, 1.0, 0.95, 0.3]
        prior[UNSURE:UNSURE + N_BINS] = np.maximum(centres, self.min_stability)
        self.prior = prior
        self._num = np.zeros((self.num_layers, N_CLASSES))  # decayed sum of surviving-route fractions
        self._den = np.zeros((self.num_layers, N_CLASSES))  # decayed count of measured rows
        self._score = np.zeros((self.num_layers, self.num_experts))
        self._reuse = np.zeros((self.num_layers, self.num_experts))
        self._row_class: np.ndarray | None = None
        self._class_counts: np.ndarray | None = None
        self._prev: list[tuple[np.ndarray, np.ndarray, np.ndarray | None] | None] = [None] * self.num_layers
        self._reuse_inputs: list[tuple[np.ndarray, np.ndarray, int] | None] = [None] * self.num_layers

    @classmethod
    def from_config(cls, num_layers: int, num_experts: int, config: Any) -> OledPolicy:
        return cls(
            num_layers,
            num_experts,
            confidence_threshold=config.oled_confidence_threshold,
            decay=config.oled_decay,
            block_decay=config.oled_block_decay,
            min_stability=config.oled_min_stability,
            gate_power=config.oled_gate_power,
        )

    # ------------------------------------------------------------------ events
    def on_block_start(self, block_index: int, token_ids: Any) -> None:
        self._score *= self.block_decay
        self._set_classes(np.full(int(np.prod(tuple(token_ids.shape))), FRESH, dtype=np.intp))
        self._prev = [None] * self.num_layers

    def on_iteration(self, event: Any) -> None:
        self._set_classes(self.classify(
            as_numpy(event.masked).reshape(-1),
            as_numpy(event.confidence).reshape(-1),
            as_numpy(event.committed).reshape(-1),
        ))

    def _set_classes(self, cls: np.ndarray | None) -> None:
        self._row_class = cls
        self._class_counts = None if cls is None else np.bincount(cls, minlength=N_CLASSES)

    def on_block_end(self, block_index: int, token_ids: Any) -> None:
        self._set_classes(None)
        self._prev = [None] * self.num_layers

    def classify(self, masked: np.ndarray, confidence: np.ndarray, committed: np.ndarray) -> np.ndarray:
        """Stability class per row from one event (see module docstring, step 1)."""
        masked = masked.astype(bool)
        committed = committed.astype(bool)
        conf = confidence.astype(np.float64)
        bins = np.minimum((conf / self.threshold * N_BINS).astype(np.intp), N_BINS - 1)
        unsure_cls = np.where(conf >= self.threshold, CONFIDENT, UNSURE + np.maximum(bins, 0))
        cls = np.where(masked & ~committed, unsure_cls, DECODED)
        return np.where(committed, COMMITTED, cls).astype(np.intp)

    def stability(self, layer: int) -> np.ndarray:
        """Calibrated stability per class for one layer, in [min_stability, 1]."""
        s = (self.prior * self.prior_rows + self._num[layer]) / (self.prior_rows + self._den[layer])
        return np.clip(s, self.min_stability, 1.0)

    # ------------------------------------------------------------------ routing
    def _update(self, layer: int, ids: np.ndarray, weights: Any, counts: np.ndarray, clock: int) -> None:
        rows, k = ids.shape
        if self._row_class is not None and self._row_class.shape[0] == rows:
            cls, cls_counts = self._row_class, self._class_counts
        else:  # prefill / refresh / prompt rows: stable
            cls, cls_counts = np.zeros(rows, dtype=np.intp), None
        if self.calibrate:
            self._measure(layer, ids, cls, cls_counts)
        s_row = self.stability(layer)[cls]
        flat = ids.reshape(-1)
        if weights is None or self.gate_power == 0.0:
            entry = np.repeat(s_row / k, k)
        else:
            g = as_numpy(weights).reshape(rows, k).astype(np.float32)  # gates are >= 0
            if self.gate_power == 0.5:
                g = np.sqrt(g)
            elif self.gate_power != 1.0:
                g **= self.gate_power
            entry = (g * (s_row / np.maximum(g.sum(axis=1), 1e-12))[:, None]).reshape(-1)
        score = self._score[layer]
        score *= self.decay
        score += np.bincount(flat, weights=entry, minlength=self.num_experts)
        self._reuse_inputs[layer] = (flat, s_row, k)

    def _measure(self, layer: int, ids: np.ndarray, cls: np.ndarray, cls_counts: np.ndarray | None) -> None:
        """Update per-class route persistence from the previous forward of this block."""
        prev = self._prev[layer]
        if prev is not None and prev[0].shape == ids.shape:
            prev_ids, prev_cls, prev_counts = prev
            # routes of a row are distinct experts: matches over both axes = routes kept
            kept = (prev_ids[:, :, None] == ids[:, None, :]).sum(axis=(1, 2)) / ids.shape[1]
            if prev_counts is None:
                prev_counts = np.bincount(prev_cls, minlength=N_CLASSES)
            lam = self.calibration_decay
            num, den = self._num[layer], self._den[layer]
            num *= lam
            num += np.bincount(prev_cls, weights=kept, minlength=N_CLASSES)
            den *= lam
            den += prev_counts
        self._prev[layer] = (ids.copy(), cls, cls_counts)

    # ------------------------------------------------------------------ ranking
    def priority_array(self, layer: int) -> np.ndarray:
        return self._score[layer]

    def reuse_array(self, layer: int) -> np.ndarray:
        """P(requested next) = 1 - prod over routes (1 - s_row); reuse = p / (1 - p). Lazy: only
        accesses with misses to dispatch pay for it."""
        pending = self._reuse_inputs[layer]
        if pending is not None:
            flat, s_row, k = pending
            log_miss = np.repeat(np.log1p(-np.minimum(s_row, 0.99)), k)
            p = -np.expm1(np.bincount(flat, weights=log_miss, minlength=self.num_experts))
            self._reuse[layer] = np.minimum(p / np.maximum(1.0 - p, 1e-9), MAX_REUSE)
            self._reuse_inputs[layer] = None
        return self._reuse[layer]
