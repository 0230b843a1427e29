"""Online-weighted mix of short- and long-horizon value (``mix``), LeCaR/CACHEUS-style.

Why. Which horizon pays differs by workload: on the mini-like synthetic workload OLED's
one-iteration confidence score wins, on models nobody tuned on a frequency does (issue 36). LeCaR
(HotStorage 2018) and CACHEUS (FAST 2021) learn online, by regret, how much to trust a recency-like
and a frequency-like expert; here the two experts are ``oled`` (confidence-guided, short horizon)
and ``value`` (decayed use frequency x token load, long horizon).

The algorithm, per MoE layer:

* State: the two policies' own state (each hears every access and event); per layer a decayed
  count of *virtual misses* of each, ``m_oled`` and ``m_value``; the weight ``w`` of ``oled``.
* Per access, before the two update: each policy's virtual cache is the ``capacity`` experts it
  ranks highest (what it would hold at this layer's slot count); its virtual misses are the
  requested experts outside it. ``m_x <- gamma * m_x + misses_x``; then
  ``w = 1 / (1 + exp(-eta * (m_value - m_oled) / requested))`` (the better recent ranking gets
  the weight; ``eta`` the learning rate, per requested expert so that it does not scale with k).
* Priority: ``w * oled / max(oled) + (1 - w) * value / max(value)`` (each scaled to [0, 1] in
  the layer); predicted reuse: the same mix of the two policies' reuse predictions. One value,
  read by retention and by the dispatcher's admission (rule 4's ``reuse_min`` and its victim test).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import CachePolicy, register
from .oled import OledPolicy
from .value import ValuePolicy


@register
class MixPolicy(CachePolicy):
    """``oled`` and ``value`` weighted online by their recent virtual misses (module docstring)."""

    name = "mix"
    tracks_usage = False
    uses_weights = True

    def __init__(self, num_layers: int, num_experts: int, eta: float = 4.0, gamma: float = 0.9,
                 value_decay: float = 0.9, **knobs: Any) -> None:
        super().__init__(num_layers, num_experts, **knobs)
        if not float(eta) >= 0:
            raise ValueError(f"mix eta={eta!r} is invalid: must be a number >= 0")
        if not 0.0 <= float(gamma) < 1.0:
            raise ValueError(f"mix gamma={gamma!r} is invalid: must be a number in [0, 1)")
        self.eta, self.gamma = float(eta), float(gamma)
        self.short = OledPolicy(num_layers, num_experts)
        self.long = ValuePolicy(num_layers, num_experts, decay=value_decay)
        self._misses = np.zeros((self.num_layers, 2))  # decayed virtual misses: [oled, value]
        self._w = np.full(self.num_layers, 0.5)
        self._prio = np.zeros((self.num_layers, self.num_experts))
        self._reuse = np.zeros((self.num_layers, self.num_experts))

    def set_capacities(self, capacities: list[int]) -> None:
        super().set_capacities(capacities)
        self.short.set_capacities(capacities)
        self.long.set_capacities(capacities)

    def on_block_start(self, block_index: int, token_ids: Any) -> None:
        self.short.on_block_start(block_index, token_ids)
        self.long.on_block_start(block_index, token_ids)

    def on_iteration(self, event: Any) -> None:
        self.short.on_iteration(event)
        self.long.on_iteration(event)

    def on_block_end(self, block_index: int, token_ids: Any) -> None:
        self.short.on_block_end(block_index, token_ids)
        self.long.on_block_end(block_index, token_ids)

    def weight(self, layer: int) -> float:
        """The current weight of ``oled`` in the layer (``1 - weight`` is ``value``'s)."""
        return float(self._w[layer])

    def _update(self, layer: int, ids: np.ndarray, weights: Any, counts: np.ndarray, clock: int) -> None:
        used = counts > 0
        n_used = int(np.count_nonzero(used))
        cap = self.num_experts if self.capacities is None else int(self.capacities[layer])
        if 0 < cap < self.num_experts and n_used:
            m = self._misses[layer]
            m *= self.gamma
            for i, policy in enumerate((self.short, self.long)):
                prio = policy.priority_array(layer)
                top = np.argpartition(-prio, cap - 1)[:cap]
                m[i] += n_used - int(np.count_nonzero(used[top]))
            z = self.eta * (m[1] - m[0]) / n_used
            self._w[layer] = 1.0 / (1.0 + np.exp(-np.clip(z, -50.0, 50.0)))
        self.short.observe_access(layer, ids, weights, clock, counts)
        self.long.observe_access(layer, ids, weights, clock, counts)

    def priority_array(self, layer: int) -> np.ndarray:
        w = self._w[layer]
        a, b = self.short.priority_array(layer), self.long.priority_array(layer)
        out = np.multiply(a, w / max(float(a.max()), 1e-12), out=self._prio[layer])
        out += b * ((1.0 - w) / max(float(b.max()), 1e-12))
        return out

    def reuse_array(self, layer: int) -> np.ndarray:
        w = self._w[layer]
        out = np.multiply(self.short.reuse_array(layer), w, out=self._reuse[layer])
        out += (1.0 - w) * self.long.reuse_array(layer)
        return out
