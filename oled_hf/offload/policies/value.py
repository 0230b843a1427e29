"""Long-horizon value retention (``value``): a decayed use frequency, cost-weighted, with confidence as a multiplier.

Why. On LLaDA2-shaped workloads the copy engine and the CPU are both near saturation, so what
decides TPOT is which experts stay and which misses are admitted, over many iterations, not the
next iteration alone (issue 36: the Belady rung is far ahead of the next-iteration oracle;
``lfu-full`` beats one-iteration confidence on untuned models). The value of keeping an expert is
its expected future uses times what each use would cost as a miss; a frequency estimate that
ages (TinyLFU's halved sketch, here an exact per-expert EMA: 256 experts a layer need no sketch)
is the estimator of the first factor, the token load the second.

The algorithm, per MoE layer:

* State: ``u_e``, an exponentially decayed use indicator (an estimate of the per-access use
  probability over a horizon of about ``1 / (1 - decay)`` accesses of the layer); ``n_e``, an EMA
  of the tokens routed to ``e`` when it is used; the settled mask of the current block's rows
  (from the decoder's last iteration event).
* Per iteration event: a row is *settled* if it is decoded, committed now, or masked with
  confidence >= ``confidence_threshold``; the first iteration of a block and rows without an
  event (prefill, refresh) have no confidence information.
* Per access: ``x_e = 0`` if unused, else ``1 - c + c * settled_e`` (``settled_e`` = 1 if any of
  its routes comes from a settled row, 0 if none does, 1 where no confidence is known; ``c`` =
  ``confidence_weight``, 0 = pure frequency); ``u_e <- decay * u_e + (1 - decay) * x_e``;
  ``n_e <- 0.5 * n_e + 0.5 * tokens_e`` where used (the first use sets ``n_e = tokens_e``).
* Priority (retention evicts the lowest; planner rule 4's reuse copies displace only lower
  priorities, TinyLFU's admission rule): ``u_e * max(1, n_e / cpu_knee)``: the CPU time a miss
  of ``n`` tokens costs is flat up to the knee (a read-bound expert: ``cpu_expert_fixed_s /
  cpu_s_per_token``, 10 tokens at the H200 preset) and linear beyond, so heavy experts are worth
  more per use. Ties by recency (a term below any change of ``u``).
* Predicted reuse (the dispatcher's amortisation and rule 4's ``reuse_min``): ``u / (1 - u)``,
  capped (``base.geometric_reuse``), on the same ``u``: one value read by retention and admission.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import CachePolicy, as_numpy, geometric_reuse, register


@register
class ValuePolicy(CachePolicy):
    """Decayed use frequency x token-load cost factor, confidence as a multiplier (module docstring)."""

    name = "value"
    tracks_usage = False

    def __init__(self, num_layers: int, num_experts: int, decay: float = 0.9, confidence_weight: float = 0.0,
                 confidence_threshold: float = 0.9, cpu_knee: float = 10.0, **knobs: Any) -> None:
        super().__init__(num_layers, num_experts, **knobs)
        for name, v, lo, hi in (("decay", decay, 0.0, 1.0), ("confidence_weight", confidence_weight, 0.0, 1.0),
                                ("confidence_threshold", confidence_threshold, 0.0, 1.0)):
            if not lo <= float(v) <= hi or (name == "decay" and float(v) == 1.0):
                raise ValueError(f"value {name}={v!r} is invalid: must be a number in [{lo:g}, {hi:g}"
                                 f"{')' if name == 'decay' else ']'}")
        if not float(cpu_knee) > 0:
            raise ValueError(f"value cpu_knee={cpu_knee!r} is invalid: must be a number > 0 (tokens)")
        self.decay = float(decay)
        self.confidence_weight = float(confidence_weight)
        self.threshold = float(confidence_threshold)
        self.cpu_knee = float(cpu_knee)
        shape = (self.num_layers, self.num_experts)
        self._u = np.zeros(shape)
        self._n = np.zeros(shape)
        self._last = np.zeros(shape)
        self._prio = np.zeros(shape)
        self._clock = 0
        self._settled: np.ndarray | None = None  # bool per row of the block, None: no confidence known

    def on_block_start(self, block_index: int, token_ids: Any) -> None:
        self._settled = None

    def on_iteration(self, event: Any) -> None:
        masked = as_numpy(event.masked).reshape(-1).astype(bool)
        confidence = as_numpy(event.confidence).reshape(-1)
        committed = as_numpy(event.committed).reshape(-1).astype(bool)
        self._settled = ~masked | committed | (confidence >= self.threshold)

    def on_block_end(self, block_index: int, token_ids: Any) -> None:
        self._settled = None

    def _update(self, layer: int, ids: np.ndarray, weights: Any, counts: np.ndarray, clock: int) -> None:
        used = counts > 0
        x = used.astype(np.float64)
        c = self.confidence_weight
        if c and self._settled is not None and self._settled.shape[0] == ids.shape[0]:
            settled = np.bincount(ids[self._settled].reshape(-1), minlength=self.num_experts) > 0
            x[used] = 1.0 - c + c * settled[used]
        u = self._u[layer]
        u *= self.decay
        u += (1.0 - self.decay) * x
        n = self._n[layer]
        old, new = n[used], counts[used]
        n[used] = np.where(old > 0, 0.5 * old + 0.5 * new, new)  # the first use sets it
        self._last[layer][used] = clock + 1.0
        self._clock = max(self._clock, clock + 1)

    def priority_array(self, layer: int) -> np.ndarray:
        out = np.maximum(self._n[layer] / self.cpu_knee, 1.0, out=self._prio[layer])
        out *= self._u[layer]
        out += 1e-9 * self._last[layer] / (self._clock + 1.0)
        return out

    def reuse_array(self, layer: int) -> np.ndarray:
        return geometric_reuse(self._u[layer])
