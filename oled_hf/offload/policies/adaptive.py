"""Retention that follows the best of several candidate policies, scored on shadow caches (``adaptive``).

Why. Which retention pays depends on the workload: on the project's own traces recency plus
confidence (``oled``) wins, on models nobody tuned on plain frequency (``lfu``) does. A user cannot
tune on data they have not seen, so the cache learns online which candidate to follow.

Sources. ARC (Megiddo & Modha, FAST 2003) balances recency and frequency with ghost lists of what
each side would have kept; LeCaR (Vietri et al., HotStorage 2018) and CACHEUS (Rodriguez et al.,
FAST 2021) keep a few expert policies and weight them by their regret (the misses each would have
had). Here each candidate runs a whole *shadow* cache, so its regret is exactly what the real
system would have paid under it.

The rule, per MoE layer access (everything is known at run time, nothing reads the trace's future):

* every candidate (knob ``candidates``, default ``oled,lru,lfu``) hears every access and event;
* every ``sample``-th access of a layer, each candidate's shadow ``CacheState`` (same capacities as
  the real cache) is planned on this routing by the very planner and dispatcher the real cache uses
  (``CacheState.plan``); its cost is the misses it had, plus its copies (each copy is bus time the
  dispatcher would pay). Costs decay with a half-life of ``half_life`` accesses of the layer;
* the real cache ranks by the candidate with the lowest decayed cost; another candidate takes over
  only once it beats the current one by the relative ``margin`` (hysteresis against flapping);
  ``scope="layer"`` chooses per layer, ``scope="global"`` one candidate for all layers (costs summed).

Because the shadows are planned inside ``CacheState.plan`` (before the real plan of the same
access), live runs and replays take the same decisions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import CachePolicy, register

CANDIDATES = ("oled", "lru", "lfu", "value", "score", "tide", "static", "moe-infinity")
SCOPES = ("layer", "global")
KNOBS = ("candidates", "half_life", "margin", "scope", "sample")


def _candidates(value: Any) -> tuple[str, ...]:
    names = tuple(value.split(",")) if isinstance(value, str) else tuple(value)
    names = tuple(str(n).strip() for n in names)
    bad = [n for n in names if n not in CANDIDATES]
    if not names or bad or len(set(names)) != len(names):
        raise ValueError(f"adaptive candidates={value!r} is invalid: distinct names from {', '.join(CANDIDATES)}")
    return names


@register
class AdaptivePolicy(CachePolicy):
    """Follows the candidate retention with the lowest decayed shadow-cache cost (module docstring)."""

    name = "adaptive"
    tracks_usage = False
    uses_weights = True

    def __init__(self, num_layers: int, num_experts: int, candidates: Any = ("oled", "lru", "lfu"),
                 half_life: float = 64.0, margin: float = 0.05, scope: str = "layer", sample: int = 1,
                 **knobs: Any) -> None:
        if knobs:
            raise ValueError(f"unknown adaptive knob(s): {', '.join(sorted(knobs))}; known: {', '.join(KNOBS)}")
        super().__init__(num_layers, num_experts)
        from . import make_policy

        self.names = _candidates(candidates)
        if isinstance(half_life, bool) or not isinstance(half_life, (int, float)) or not half_life > 0:
            raise ValueError(f"adaptive half_life={half_life!r} is invalid: must be a number > 0 (accesses)")
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 1:
            raise ValueError(f"adaptive margin={margin!r} is invalid: must be a number in [0, 1)")
        if scope not in SCOPES:
            raise ValueError(f"adaptive scope={scope!r} is invalid: must be one of {', '.join(SCOPES)}")
        if isinstance(sample, bool) or not isinstance(sample, int) or sample < 1:
            raise ValueError(f"adaptive sample={sample!r} is invalid: must be an integer >= 1")
        self.decay = 0.5 ** (1.0 / float(half_life))
        self.margin, self.scope, self.sample = float(margin), scope, int(sample)
        self.policies = [make_policy(n, num_layers, num_experts) for n in self.names]
        self.cost = np.zeros((self.num_layers, len(self.names)))
        self.choice = np.zeros(self.num_layers, dtype=np.int64)
        self.switches = 0
        self._seen = np.zeros(self.num_layers, dtype=np.int64)
        self._shadows: list[Any] | None = None

    # ------------------------------------------------------------------ events, forwarded
    def set_capacities(self, capacities: list[int]) -> None:
        super().set_capacities(capacities)
        for p in self.policies:
            p.set_capacities(capacities)

    def on_block_start(self, block_index: int, token_ids: Any) -> None:
        for p in self.policies:
            p.on_block_start(block_index, token_ids)

    def on_iteration(self, event: Any) -> None:
        for p in self.policies:
            p.on_iteration(event)

    def on_block_end(self, block_index: int, token_ids: Any) -> None:
        for p in self.policies:
            p.on_block_end(block_index, token_ids)

    def on_admitted(self, layer: int, experts: np.ndarray, clock: int) -> None:
        for p in self.policies:
            p.on_admitted(layer, experts, clock)

    def _update(self, layer: int, ids: np.ndarray, weights: Any, counts: np.ndarray, clock: int) -> None:
        for p in self.policies:
            p.observe_access(layer, ids, weights, clock, counts)

    # ------------------------------------------------------------------ shadows
    def before_plan(self, state: Any, layer: int, ids: np.ndarray, counts: np.ndarray, dispatcher: Any) -> None:
        """Plan every candidate's shadow cache on this access (``CacheState.plan`` calls it first)."""
        if self._shadows is None or self._shadows[0].capacities != list(state.capacities):
            # the state's own class (the planner's CacheState): policies never import the planner
            self._shadows = [type(state)(state.num_layers, state.num_experts, list(state.capacities))
                             for _ in self.policies]  # (re)started on a rebalance: a fresh warm-up
        self._seen[layer] += 1
        if (self._seen[layer] - 1) % self.sample:
            return
        cost = self.cost[layer]
        cost *= self.decay ** self.sample
        for i, (shadow, policy) in enumerate(zip(self._shadows, self.policies)):
            st = shadow.stats
            before = st.misses[layer] + st.copies[layer]
            shadow.plan(layer, ids, None, policy, dispatcher, counts)
            cost[i] += st.misses[layer] + st.copies[layer] - before
        if self.scope == "layer":
            self.choice[layer] = self._pick(cost, int(self.choice[layer]))
        else:
            total = self.cost.sum(axis=0)
            self.choice[:] = self._pick(total, int(self.choice[0]))

    def _pick(self, cost: np.ndarray, current: int) -> int:
        best = int(np.argmin(cost))
        if best != current and cost[best] < (1.0 - self.margin) * cost[current]:
            self.switches += 1
            return best
        return current

    def chosen(self, layer: int) -> str:
        return self.names[int(self.choice[layer])]

    # ------------------------------------------------------------------ ranking: the chosen candidate's
    def _cur(self, layer: int) -> CachePolicy:
        return self.policies[int(self.choice[layer])]

    def priority_array(self, layer: int) -> np.ndarray:
        return self._cur(layer).priority_array(layer)

    def reuse_array(self, layer: int) -> np.ndarray:
        return self._cur(layer).reuse_array(layer)

    def reuse_of(self, layer: int, experts: np.ndarray) -> np.ndarray:
        return self._cur(layer).reuse_of(layer, experts)

    def reuse_inputs(self, layer: int):
        return self._cur(layer).reuse_inputs(layer)

    def admission(self, layer: int) -> np.ndarray | None:
        return self._cur(layer).admission(layer)
