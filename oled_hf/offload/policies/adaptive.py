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
* every ``sample``-th access of a layer, each candidate not followed now has its shadow
  ``CacheState`` (same capacities as the real cache, rebalanced with it) planned on this routing by
  the very planner and dispatcher the real cache uses (``CacheState.plan``); the followed candidate
  is scored on the real plan (the real cache is its cache: one shadow plan fewer per access), and
  its shadow is re-seeded from the real cache when it stops being followed; on a layer a prefetch
  part copies into (outside any plan, unseen by the shadows) it is planned on its shadow as well.
  A cost (knob ``cost``) is, by default (``misses``), the misses plus the copies, or (``time``) the
  time the plan takes over an all-resident access as the dispatcher's cost model believes it
  (``_overhead_s``). Costs decay with a half-life of ``half_life`` accesses of the layer;
* the real cache ranks by the candidate with the lowest decayed cost; another candidate takes over
  only once it beats the current one by the relative ``margin`` (hysteresis against flapping) and,
  with ``switch_cost="transition"``, by more than the misses and copies the switch itself costs
  (the experts its shadow holds that the real cache lacks: a switch must pay for itself, ``_pick``;
  off by default: on dev it steadied the stationary trace and slowed the reaction to a shift more);
  ``scope="layer"`` chooses per layer, ``scope="global"`` one candidate for all layers (costs summed).

Off the critical path. Only the followed candidate hears an access before the real plan (its
ranking is the plan's input); the others' updates and every shadow plan wait until
:meth:`AdaptivePolicy.run_shadows`, which the executor calls before the next layer's routing comes
to the host (on a GPU the host would wait there while the device computes) and replay charges on
the host after the plan,
where it delays the next layer only if it outlasts this layer's device work. Whatever is still
pending runs at the start of the next plan or event at the latest, so live runs and replays,
whoever calls it, take the same decisions: access ``t`` is planned with the choice the shadows made
through access ``t - 1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .base import CachePolicy, as_numpy, register

CANDIDATES = ("oled", "lru", "lfu", "score", "tide", "static", "moe-infinity")
SCOPES = ("layer", "global")
COSTS = ("misses", "time")
SWITCH_COSTS = ("none", "transition")
# the defaults cost "misses", half_life 32, margin 0.02 were chosen on dev data only (eval/adaptive_tune.py:
# a synthetic shift run of its own seed and the deep toy's dev trace; "time" lost in every setting, 64 / 0.02
# tied on the score with a worse worst segment; switch_cost "transition" scored 1.0017-1.0032 against "none"'s
# 1.0010; eval/adaptive_tune.md)
KNOBS = ("candidates", "cost", "half_life", "margin", "scope", "sample", "switch_cost")


def _candidates(value: Any) -> tuple[str, ...]:
    """The candidate names: a comma-separated string or a list of names; anything else (None, 5) is the one
    ValueError too, never a TypeError from iterating it."""
    allowed = f"distinct names from {', '.join(CANDIDATES)}, as 'oled,lru' or a list of them"
    if isinstance(value, str):
        names = tuple(value.split(","))
    elif isinstance(value, (list, tuple)) and all(isinstance(n, str) for n in value):
        names = tuple(value)
    else:
        raise ValueError(f"adaptive candidates={value!r} is invalid: {allowed}")
    names = tuple(n.strip() for n in names)
    bad = [n for n in names if n not in CANDIDATES]
    if not names or bad or len(set(names)) != len(names):
        raise ValueError(f"adaptive candidates={value!r} is invalid: {allowed}")
    return names


def _overhead_s(cm: Any, plan: Any, counts: np.ndarray, ideal_s: float) -> float:
    """What a plan costs over all-resident (``ideal_s``), as the dispatcher's cost model believes (``cost="time"``).

    The layer's routed-expert time (``CostModel.access_time``: CPU misses beside the GPU path, whose
    copies pipeline with the experts) minus the same access with every expert a hit, plus the bus
    time of its reuse copies (the next access's demand copies queue behind them). A CPU miss of one
    token is nearly free, a copy of a hot expert on the critical path is not: counts miss that.
    Written out in scalars and a few array ops (it runs per candidate per access; the cost model's
    own methods cost ~4x more here); ``tests/offload/test_adaptive.py`` holds it to them.
    """
    gfix, gtok, copy_s = cm.gpu_expert_fixed_s, cm.gpu_s_per_token, cm.copy_time()
    hits, copies, cpu = plan.hit_arrays()[0], plan.copy_arrays()[0], plan.cpu_array()
    gpu = 0.0
    if hits.size or copies.size:
        gpu = cm.gpu_layer_fixed_s + gfix * hits.size + gtok * float(counts[hits].sum())
    if copies.size:
        g = gfix + gtok * counts[copies].astype(np.float64)
        suffix = np.cumsum(g[::-1])[::-1]
        gpu = max(gpu + float(suffix[0]), float((copy_s * np.arange(1, g.size + 1) + suffix).max()))
    if cpu.size:
        n = counts[cpu].astype(np.float64)
        gpu = max(gpu, cm.cpu_overhead_s + float(np.maximum(cm.cpu_expert_fixed_s, n * cm.cpu_s_per_token).sum()))
    return gpu - ideal_s + plan.n_background * copy_s


def _ideal_s(cm: Any, counts: np.ndarray) -> float:
    """The routed-expert time of an access with every expert resident (``CostModel.gpu_path_time``)."""
    n = counts[counts > 0]
    if not n.size:
        return 0.0
    return cm.gpu_layer_fixed_s + cm.gpu_expert_fixed_s * n.size + cm.gpu_s_per_token * float(n.sum())


@dataclass
class _Pending:
    """The last access, kept for its deferred half (``run_shadows``); the planner adds its dispatcher and plan."""

    layer: int
    ids: np.ndarray
    weights: np.ndarray | None
    counts: np.ndarray
    clock: int
    dispatcher: Any = None
    plan: Any = None  # the real plan of this access (``after_plan``): it scores the followed candidate
    real_cost: int = 0  # its misses plus copies


@register
class AdaptivePolicy(CachePolicy):
    """Follows the candidate retention with the lowest decayed shadow-cache cost (module docstring)."""

    name = "adaptive"
    tracks_usage = False
    uses_weights = True

    def __init__(self, num_layers: int, num_experts: int, candidates: Any = ("oled", "lru", "lfu"),
                 half_life: float = 32.0, margin: float = 0.02, scope: str = "layer", sample: int = 1,
                 cost: str = "misses", switch_cost: str = "none", **knobs: Any) -> None:
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
        if cost not in COSTS:
            raise ValueError(f"adaptive cost={cost!r} is invalid: must be one of {', '.join(COSTS)}")
        if switch_cost not in SWITCH_COSTS:
            raise ValueError(f"adaptive switch_cost={switch_cost!r} is invalid: "
                             f"must be one of {', '.join(SWITCH_COSTS)}")
        if isinstance(sample, bool) or not isinstance(sample, int) or sample < 1:
            raise ValueError(f"adaptive sample={sample!r} is invalid: must be an integer >= 1")
        self.decay = 0.5 ** (1.0 / float(half_life))
        self.margin, self.scope, self.sample, self.cost_kind = float(margin), scope, int(sample), cost
        self.switch_cost = switch_cost
        self.policies = [make_policy(n, num_layers, num_experts) for n in self.names]
        self.cost = np.zeros((self.num_layers, len(self.names)))
        self.choice = np.zeros(self.num_layers, dtype=np.int64)
        self.switches = 0
        self._seen = np.zeros(self.num_layers, dtype=np.int64)
        self._shadows: list[Any] | None = None
        self._real: Any = None  # the real CacheState (``before_plan``)
        self._outside = np.zeros(self.num_layers, dtype=bool)  # layers a prefetch has copied into
        self._copies_planned = np.zeros(self.num_layers, dtype=np.int64)  # the real copies after each layer's plan
        self._all_layers = list(range(self.num_layers))  # scope="global": every choice moves together
        self._synced: list[int] | None = None  # the real capacities list the shadows were last rebalanced to
        self._pending: _Pending | None = None

    # ------------------------------------------------------------------ events, forwarded
    def set_capacities(self, capacities: list[int]) -> None:
        super().set_capacities(capacities)
        if self._shadows is None:  # later, each candidate holds its shadow's list (``_sync_capacities``):
            for p in self.policies:  # handed the real one, every shadow plan would hand it back (tide redoes
                p.set_capacities(capacities)  # its top set then)

    def _each(self, hook: str, *args: Any) -> None:
        """An iteration event: the last access's deferred half first, then every candidate hears it."""
        self.run_shadows()
        for p in self.policies:
            getattr(p, hook)(*args)

    def on_block_start(self, block_index: int, token_ids: Any) -> None:
        self._each("on_block_start", block_index, token_ids)

    def on_iteration(self, event: Any) -> None:
        self._each("on_iteration", event)

    def on_block_end(self, block_index: int, token_ids: Any) -> None:
        self._each("on_block_end", block_index, token_ids)

    def on_admitted(self, layer: int, experts: np.ndarray, clock: int) -> None:
        # a prefetch copied into the real cache outside a plan: its plans no longer score the followed
        # candidate alone (its prefetched hits cost no shadow anything), so its shadow is planned too,
        # from the real cache as it stands (stale while followed). A prefetch of experts already
        # resident copies nothing and changes nothing (the controller reports what it asked for).
        real = self._real
        if real is not None and not self._outside[layer] and real.stats.copies[layer] > self._copies_planned[layer]:
            self._outside[layer] = True
            self._shadows[int(self.choice[layer])].copy_layer_from(real, layer)
        for p in self.policies:
            p.on_admitted(layer, experts, clock)

    def _update(self, layer: int, ids: np.ndarray, weights: Any, counts: np.ndarray, clock: int) -> None:
        self.run_shadows()  # the previous access's, if nobody ran them yet
        # the followed candidate now (its ranking plans this access); the others in run_shadows
        self._cur(layer).observe_access(layer, ids, weights, clock, counts)
        w = None if weights is None else np.array(as_numpy(weights), copy=True)
        self._pending = _Pending(layer, np.array(ids, copy=True), w, counts, clock)

    # ------------------------------------------------------------------ shadows
    def before_plan(self, state: Any, layer: int, ids: np.ndarray, counts: np.ndarray, dispatcher: Any) -> None:
        """Note the planner and dispatcher of this access (``CacheState.plan`` calls it first)."""
        self._real = state
        if self._shadows is None:
            # the state's own class (the planner's CacheState): policies never import the planner
            self._shadows = [type(state)(state.num_layers, state.num_experts, list(state.capacities))
                             for _ in self.policies]
        self._sync_capacities()
        if self._pending is not None and self._pending.layer == layer:
            self._pending.dispatcher = dispatcher

    def after_plan(self, plan: Any, misses_and_copies: int) -> None:
        """Keep the real plan of this access (``CacheState.plan`` calls it last): it scores the followed candidate."""
        self._copies_planned[plan.layer] = self._real.stats.copies[plan.layer]
        if self._pending is not None and self._pending.layer == plan.layer:
            self._pending.plan, self._pending.real_cost = plan, misses_and_copies

    def _sync_capacities(self) -> None:
        """A rebalance of the real cache moves the shadows' slots alike (each evicting by its own candidate)."""
        caps = self._real.capacities
        if caps is self._synced:  # CacheState.set_capacities replaces the list: same list, nothing moved
            return
        for shadow, policy in zip(self._shadows, self.policies):
            if shadow.capacities != caps:
                shadow.set_capacities(list(caps), policy)
        self._synced = caps

    def run_shadows(self) -> int:
        """The deferred half of the last access: the other candidates hear it, the shadows plan it.

        The followed candidate is scored on the real plan (the real cache is its cache) and its
        shadow is not planned; when it stops being followed, its shadow is re-seeded from the real
        cache. Returns how many shadow plans ran (0 when nothing was pending, or off the ``sample``):
        replay charges host time per shadow plan where it charges a stated planner time.
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return 0
        layer, ids, counts, dispatcher = pending.layer, pending.ids, pending.counts, pending.dispatcher
        followed = int(self.choice[layer])
        for i, p in enumerate(self.policies):
            if i != followed:
                p.observe_access(layer, ids, pending.weights, pending.clock, counts)
        self._seen[layer] += 1
        if dispatcher is None or self._shadows is None or (self._seen[layer] - 1) % self.sample:
            return 0
        cost = self.cost[layer]
        cost *= self.decay ** self.sample
        cm = dispatcher.cost_model if self.cost_kind == "time" else None
        ideal = _ideal_s(cm, counts) if cm is not None else 0.0
        self._sync_capacities()
        for i, (shadow, policy) in enumerate(zip(self._shadows, self.policies)):
            if i == followed and not self._outside[layer]:
                if pending.plan is not None:
                    cost[i] += pending.real_cost if cm is None else _overhead_s(cm, pending.plan, counts, ideal)
                continue
            st = shadow.stats
            before = st.misses[layer] + st.copies[layer]
            plan = shadow.plan(layer, ids, None, policy, dispatcher, counts)
            cost[i] += (st.misses[layer] + st.copies[layer] - before) if cm is None else \
                _overhead_s(cm, plan, counts, ideal)
        if self.scope == "layer":
            layers, total = [layer], cost
        else:
            layers, total = self._all_layers, self.cost.sum(axis=0)
        unit = 2.0 if cm is None else cm.copy_time()  # a miss and a copy; or the copy's bus time
        self.choice[layers] = self._pick(total, followed, layers, unit)
        left = layers if self.choice[layer] != followed else []
        for l in left:  # its shadow missed what the real cache did while it was followed
            if not self._outside[l]:
                self._shadows[followed].copy_layer_from(self._real, l)
        return len(self.policies) - (0 if self._outside[layer] else 1)

    def _pick(self, cost: np.ndarray, current: int, layers: list[int], unit: float) -> int:
        """The candidate to follow: the cheapest, once its lead pays for the switch.

        Its lead must pass the ``margin`` and, with ``switch_cost="transition"``, also what the
        switch itself costs: every expert the newcomer's shadow holds that the real cache lacks is a
        miss and a copy the real cache pays before it holds what the newcomer would (``unit``). The
        lead is a decayed sum over about ``half_life / ln 2`` accesses, so a switch is taken once
        that window's saving would have paid for its transition; a shorter lead only churns the
        cache: both shadows looked cheaper than the cache that switches between them.
        """
        best = int(np.argmin(cost))
        if best == current:
            return current
        lead = cost[current] - cost[best]
        if lead <= self.margin * cost[current]:
            return current
        if self.switch_cost == "transition":
            shadow = self._shadows[best]
            gap = sum(int((shadow.resident_mask(l) & ~self._real.resident_mask(l)).sum()) for l in layers)
            if lead <= gap * unit:
                return current
        self.switches += 1
        return best

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
