"""OLED: confidence-guided expert retention for block-diffusion decoding (the OLED-MoE paper's).

Why it works. Adjacent denoising iterations route almost the same experts, but not uniformly so:
a token whose identity is settled (decoded earlier, committed now, or masked with a confident
prediction) keeps its hidden state, hence its routes, across iterations; an unsure masked token's
prediction is still moving and so are its routes. An expert used by settled tokens is therefore
likely to be requested again next iteration; one used only by unsure tokens is not. OLED ranks
experts by that likelihood instead of by recency or frequency.

The rule, per MoE layer access (rows = batch*B block positions, row r = batch r//B, position r%B):

1. Each row gets a stability class from the latest iteration event: decoded earlier, committed in
   the last iteration, masked & confident (p >= threshold), masked & unsure (4 confidence bins),
   fresh (a new block's first iteration: no confidence yet), edited (LLaDA2.1 editing replaced the
   token in the last iteration: its input embedding changes, so its routes move), or stable
   (prefill / KV-refresh / prompt rows, whose count differs from the block's, and everything
   before the first event).
2. A class's stability s is the probability that a route of such a row survives into the next
   iteration. Priors follow the method (settled = 1, confident ~ 0.95, unsure ~ its confidence with
   a floor > 0, fresh = 0.3, edited = 0.5) and are *calibrated online per layer* (each class on its
   own, so edited tokens' persistence is measured apart from decoded ones) by measuring route persistence
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
6. A second, slow time scale: ``freq_e <- freq_decay * freq_e + tokens_e / T`` per access, added to
   the priority with ``freq_weight``. Retention by stability forgets across blocks and prompts by
   design; what recurs there is popularity, so the slow term keeps popular experts through a
   block boundary (on traces of the trained toy model it recovers most of LFU's lead across
   prompts while keeping the within-block ranking; weight 0 gives the pure stability rule).
   Default 0 since reuse copies (below): on the long-answer dev trace weight 1 costs 10-13% TPOT
   at 25-40% cache (3.37x vs 3.07x fused at 40%), as popular-but-idle experts block reuse copies.
7. Reuse copies are not this policy's business: they are the dispatch part ``cpu+reuse``
   (``oled_hf.offload.dispatch``, planner rule 4), which any policy can be composed with. The
   ``oled`` preset (``oled_hf.offload.system``) composes this policy with it: up to 2 CPU-computed
   misses per access with predicted reuse >= 1 are also copied off the critical path, and each
   access is split for its own makespan (``OffloadConfig.oled_background_copies`` and
   ``oled_background_min_reuse`` are that dispatch's knobs, ``system.resolve_system``).
8. Knob ``reuse`` picks the reuse the dispatcher amortises a copy over: ``confidence`` (rule 4,
   the default) or ``usage``, the base policy's long-horizon run length ``u / (1 - u)`` of a usage
   EMA with decay ``usage_decay``. Rule 4 answers one iteration ahead: a settled token's route has
   p = 1, so its reuse is the cap and the amortised ``cpu`` dispatch copies nearly every miss. Hence
   the preset splits each access for itself (``cpu+reuse``). With ``reuse=usage`` the amortised
   split is the better dispatch where copies are dear against CPU time. On the flash-like dev seeds 1-2,
   ``eval/ablate_parts.py`` gives 0.95x the preset's TPOT at 40% and 0.97x at 25%, but 1.01x at 15%.
   On mini-like it gives 1.03x at 40%. The report's tuning grid chooses between the two per workload.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import kernels
from .base import NO_FLOATS, NO_INTS, CachePolicy, as_numpy, geometric_reuse, register

STABLE, DECODED, COMMITTED, CONFIDENT, UNSURE, FRESH, EDITED = 0, 1, 2, 3, 4, 8, 9  # UNSURE..UNSURE+3 = bins
N_BINS = 4
N_CLASSES = 10
REUSE_RULES = ("confidence", "usage")  # rule 4, rule 8


@register
class OledPolicy(CachePolicy):
    """Confidence-guided retention with online-calibrated per-class route stability."""

    name = "oled"
    tracks_usage = False
    uses_weights = True

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
        freq_weight: float = 0.0,
        freq_decay: float = 0.99,
        reuse: str = "confidence",
        usage_decay: float = 0.8,
        **knobs: Any,
    ) -> None:
        super().__init__(num_layers, num_experts, **knobs)
        if reuse not in REUSE_RULES:
            raise ValueError(f"oled reuse={reuse!r} is unknown; allowed: {', '.join(REUSE_RULES)}")
        if isinstance(usage_decay, bool) or not isinstance(usage_decay, (int, float)) or not 0.0 <= usage_decay < 1.0:
            raise ValueError(f"oled usage_decay={usage_decay!r} is invalid: must be a number in [0, 1)")
        self.reuse = reuse
        self.tracks_usage = reuse == "usage"  # the base's usage EMA (rule 8); rule 4 needs none
        self.usage_decay = float(usage_decay)
        self.threshold = float(confidence_threshold)
        self.decay = float(decay)
        self.block_decay = float(block_decay)
        self.min_stability = float(min_stability)
        self.gate_power = float(gate_power)
        self.calibrate = bool(calibrate)
        self.prior_rows = float(prior_rows)  # prior, prior_rows: fixed after construction
        self.calibration_decay = float(calibration_decay)
        self.freq_weight = float(freq_weight)
        self.freq_decay = float(freq_decay)
        centres = self.threshold * (np.arange(N_BINS) + 0.5) / N_BINS
        prior = np.empty(N_CLASSES)
        prior[[STABLE, DECODED, COMMITTED, CONFIDENT, FRESH, EDITED]] = [1.0, 1.0, 1.0, 0.95, 0.3, 0.5]
        prior[UNSURE:UNSURE + N_BINS] = np.maximum(centres, self.min_stability)
        self.prior = prior
        # calibration per layer: [0] decayed sum of surviving-route fractions, [1] decayed count of measured
        # rows (one array, so decaying both is one operation); stability = (pseudo[0] + num) / (pseudo[1] + den)
        self._calib = np.zeros((self.num_layers, 2, N_CLASSES))
        self._num, self._den = self._calib[:, 0], self._calib[:, 1]
        self._pseudo = np.stack((prior * self.prior_rows, np.full(N_CLASSES, self.prior_rows)))
        self._score = np.zeros((self.num_layers, self.num_experts))
        self._freq = np.zeros((self.num_layers, self.num_experts))  # slow popularity (rule 6)
        self._priority = np.zeros((self.num_layers, self.num_experts))
        self._reuse = np.zeros((self.num_layers, self.num_experts))
        self._row_class: np.ndarray | None = None
        self._class_counts: np.ndarray | None = None
        self._entry_class: np.ndarray | None = None  # _row_class repeated per route (cached)
        # per layer, the previous forward of this block: (ids, ids shape, class per row, class counts, class per route)
        self._prev: list[tuple[np.ndarray, tuple[int, ...], np.ndarray, np.ndarray | None, np.ndarray] | None]
        self._prev = [None] * self.num_layers
        # per layer, the calibrated stability per class (refreshed in place whenever the calibration moves)
        self._stab = np.empty((self.num_layers, N_CLASSES))
        for layer in range(self.num_layers):
            kernels.stability(self._pseudo, self._calib[layer], self.min_stability, self._stab[layer])
        # per layer, what the lazy reuse needs: (flat route ids, stability per class, class per route)
        self._reuse_inputs: list[tuple[np.ndarray, np.ndarray, np.ndarray] | None] = [None] * self.num_layers
        self._stable: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}  # (rows, k) -> all-STABLE classes
        self._acc = np.empty(self.num_experts)  # the update's scratch
        self._kept: list[np.ndarray | None] = [None] * self.num_layers  # id buffers (two alternate per layer)
        self._no_counts, self._no_gates = np.zeros(N_CLASSES, dtype=np.int64), np.zeros((1, 1), dtype=np.float32)
        self._experts = np.arange(self.num_experts, dtype=np.int64)
        kernels.warm_up()

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
            freq_weight=config.oled_frequency_weight,
            freq_decay=config.oled_frequency_decay,
        )

    # ------------------------------------------------------------------ events
    def on_block_start(self, block_index: int, token_ids: Any) -> None:
        self._score *= self.block_decay
        self._set_classes(np.full(math.prod(tuple(token_ids.shape)), FRESH, dtype=np.intp))
        self._prev = [None] * self.num_layers

    def on_iteration(self, event: Any) -> None:
        edited = getattr(event, "edited", None)
        masked = as_numpy(event.masked).reshape(-1)
        confidence = as_numpy(event.confidence).reshape(-1)
        committed = as_numpy(event.committed).reshape(-1)
        edited = None if edited is None else as_numpy(edited).reshape(-1)
        self._set_classes(*self._classify(masked, confidence, committed, edited))

    def _set_classes(self, cls: np.ndarray | None, counts: np.ndarray | None = None) -> None:
        self._row_class = cls
        if counts is None and cls is not None:
            counts = np.bincount(cls, minlength=N_CLASSES)
        self._class_counts = counts
        self._entry_class = None

    def on_block_end(self, block_index: int, token_ids: Any) -> None:
        self._set_classes(None)
        self._prev = [None] * self.num_layers

    def classify(self, masked: Any, confidence: Any, committed: Any, edited: Any = None) -> np.ndarray:
        """Stability class per row from one event (see module docstring, step 1)."""
        return self._classify(*(None if a is None else as_numpy(a).reshape(-1)
                                for a in (masked, confidence, committed, edited)))[0]

    def _classify(self, masked: np.ndarray, confidence: np.ndarray, committed: np.ndarray,
                  edited: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Class per row and class counts (``kernels.classify``) of flat per-row arrays."""
        cls, counts = np.empty(masked.shape[0], dtype=np.intp), np.empty(N_CLASSES, dtype=np.int64)
        masked = _as(masked, np.bool_)
        kernels.classify(masked, _as(confidence, np.float64), _as(committed, np.bool_),
                         masked if edited is None else _as(edited, np.bool_), edited is not None,
                         self.threshold, N_BINS, _CODES, cls, counts)
        return cls, counts

    def stability(self, layer: int) -> np.ndarray:
        """Calibrated stability per class for one layer, in [min_stability, 1] (a copy)."""
        return self._stab[layer].copy()

    # ------------------------------------------------------------------ routing
    def _update(self, layer: int, ids: np.ndarray, weights: Any, counts: np.ndarray, clock: int) -> None:
        rows, k = ids.shape
        if self._row_class is not None and self._row_class.shape[0] == rows:
            cls, cls_counts = self._row_class, self._class_counts
            if self._entry_class is None or self._entry_class.shape[0] != rows * k:
                self._entry_class = np.repeat(cls, k)
            entry_cls = self._entry_class
        else:  # prefill / refresh / prompt rows: stable
            cls, entry_cls = self._all_stable(rows, k)
            cls_counts = None
        self._update_scores(layer, ids, weights, cls, cls_counts, entry_cls)
        if self.freq_weight:
            freq = self._freq[layer]
            freq *= self.freq_decay
            freq += counts * (1.0 / rows)

    def _update_scores(self, layer: int, ids: np.ndarray, weights: Any, cls: np.ndarray,
                       cls_counts: np.ndarray | None, entry_cls: np.ndarray) -> None:
        """Calibration and score update of one access (module docstring, steps 2-3): one ``kernels.oled_update``."""
        rows, k = ids.shape
        keep = self._kept[layer]
        if keep is None or keep.shape != ids.shape:  # this access's ids, kept for the next one's calibration
            keep = self._kept[layer] = np.empty(ids.shape, dtype=np.int64)
        prev = self._prev[layer]
        measure_it = self.calibrate and prev is not None and prev[1] == ids.shape
        if measure_it:
            prev_ids, _, prev_cls, prev_counts, prev_entry_cls = prev
            if prev_counts is None:
                prev_counts = np.bincount(prev_cls, minlength=N_CLASSES)
        else:
            prev_ids, prev_cls, prev_counts, prev_entry_cls = keep, cls, self._no_counts, entry_cls
        power = 0.0 if weights is None else self.gate_power  # 0: no gate weights
        gates = self._no_gates if power == 0.0 else _as(as_numpy(weights).reshape(rows, k), np.float32)
        ids = _as(ids, np.int64)
        stab = self._stab[layer]
        kernels.oled_update(ids, gates, power, cls, entry_cls, prev_ids, prev_cls, prev_entry_cls, prev_counts,
                            measure_it, keep, self._calib[layer], self.calibration_decay, self._pseudo,
                            self.min_stability, stab, self._score[layer], self.decay, self._acc)
        if self.calibrate:  # two buffers alternate: this access's becomes the previous, the previous is reused
            self._kept[layer] = prev_ids if measure_it else None
            self._prev[layer] = (keep, ids.shape, cls, cls_counts, entry_cls)
        self._reuse_inputs[layer] = (keep.reshape(-1), stab, entry_cls)

    def _all_stable(self, rows: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Class per row and per route for rows without an event (all STABLE); cached, read-only."""
        got = self._stable.get((rows, k))
        if got is None:
            got = self._stable[(rows, k)] = (np.zeros(rows, dtype=np.intp), np.zeros(rows * k, dtype=np.intp))
        return got

    # ------------------------------------------------------------------ ranking
    def priority_array(self, layer: int) -> np.ndarray:
        if not self.freq_weight:
            return self._score[layer]
        out = np.multiply(self._freq[layer], self.freq_weight, out=self._priority[layer])
        return np.add(out, self._score[layer], out=out)

    def reuse_array(self, layer: int) -> np.ndarray:
        """P(requested next) = 1 - prod over routes (1 - s_row); reuse = p / (1 - p) (``kernels.oled_reuse``).
        Lazy: only accesses with misses to dispatch pay for it. With ``reuse=usage``: the base's (rule 8)."""
        if self.tracks_usage:
            return CachePolicy.reuse_array(self, layer)
        pending = self._reuse_inputs[layer]
        if pending is not None:
            flat, stab, entry_cls = pending
            kernels.oled_reuse(flat, entry_cls, stab, self.num_experts, self._experts, self._reuse[layer])
            self._reuse_inputs[layer] = None
        return self._reuse[layer]

    def reuse_of(self, layer: int, experts: np.ndarray) -> np.ndarray:
        if self.tracks_usage:  # element-wise over the misses only, as the base's
            return geometric_reuse(self._usage[layer][experts])
        pending = self._reuse_inputs[layer]
        if pending is None:
            return self._reuse[layer][experts]
        experts = _as(np.asarray(experts), np.int64)
        out = np.empty(experts.shape[0])
        flat, stab, entry_cls = pending
        kernels.oled_reuse(flat, entry_cls, stab, self.num_experts, experts, out)  # element-wise: as the full row
        return out

    def reuse_inputs(self, layer: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if self.tracks_usage:
            return CachePolicy.reuse_inputs(self, layer)
        pending = self._reuse_inputs[layer]
        if pending is None:
            return 1, self._reuse[layer], NO_INTS, NO_INTS, NO_FLOATS
        flat, stab, entry_cls = pending
        return 2, NO_FLOATS, flat, entry_cls, stab


_CODES = np.array([DECODED, COMMITTED, CONFIDENT, UNSURE, EDITED], dtype=np.intp)  # kernels.classify's classes


def _as(a: np.ndarray, dtype: Any) -> np.ndarray:
    """``a`` as a contiguous array of ``dtype`` (no copy when it is one already)."""
    return a if a.dtype == dtype and a.flags.c_contiguous else np.ascontiguousarray(a, dtype=dtype)
