"""The cache-policy interface and the policy registry.

A policy ranks experts for retention; it never touches devices. It hears routing through
:meth:`CachePolicy.observe_access` (called once per MoE layer access, before the planner plans that
access) and the decoder's progress through the :class:`IterationObserver` hooks. The planner asks for
:meth:`priority` (evict the lowest resident), :meth:`predicted_reuse` (the dispatcher's amortisation
of a copy) and :meth:`admission` (whether a miss may take a slot at all).

State is kept in NumPy arrays: a layer access touches ~256 routing entries and a few hundred
experts, where NumPy's per-call overhead (~1 us) beats torch's (~5 us) by enough to matter in replay.
The public ``priority``/``predicted_reuse`` return torch views of that state (zero copy); the
``*_array`` variants and ``reuse_of`` (the reuse of just the misses) are the fast path the planner
uses. ``observe_access`` runs once per MoE layer per forward on the live runtime's critical path, so
an update costs a handful of NumPy calls and no Python loop over experts or tokens (OLED's is one
call of a numba kernel, ``oled_hf/offload/kernels.py``, where its rules are written).
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import numpy as np
import torch

from oled_hf.modeling.events import IterationObserver

from .. import kernels
from ..kernels import MAX_REUSE  # noqa: F401  (re-exported: the cap of every predicted reuse)

_REGISTRY: dict[str, type[CachePolicy]] = {}
NO_INTS, NO_FLOATS = np.zeros(0, dtype=np.int64), np.zeros(0)  # unused arguments of reuse_inputs


def as_numpy(x: Any) -> np.ndarray:
    """A NumPy view of a tensor (moved to the CPU if needed) or array-like."""
    if type(x) is np.ndarray:  # already converted upstream (the planner's hot path passes arrays on)
        return x
    if isinstance(x, torch.Tensor):
        if x.is_cpu and not x.requires_grad:  # the common case: skip detach()/cpu(), ~1 us each
            return x.numpy()
        return x.detach().cpu().numpy()
    return np.asarray(x)


def register(cls: type[CachePolicy]) -> type[CachePolicy]:
    _REGISTRY[cls.name] = cls
    return cls


def available_policies() -> list[str]:
    return sorted(_REGISTRY)


def make_policy(name: str, num_layers: int, num_experts: int, config: Any = None) -> CachePolicy:
    """Build a policy by name, taking its knobs from an ``OffloadConfig`` (defaults if None)."""
    from oled_hf.offload import policies  # noqa: F401  (populates the registry)

    if name not in _REGISTRY:
        raise ValueError(f"policy={name!r} is unknown; known policies: {', '.join(available_policies())}")
    if config is None:
        return _REGISTRY[name](num_layers, num_experts)
    return _REGISTRY[name].from_config(num_layers, num_experts, config)


class CachePolicy(IterationObserver):
    """Base policy: tracks a usage EMA that gives a generic reuse prediction.

    Subclasses implement :meth:`_update` (routing of one access, already converted to NumPy) and
    :meth:`priority_array`. ``capacities`` is set by the planner (and after every rebalance) for
    policies whose admission depends on the per-layer slot count.
    """

    name: ClassVar[str] = "base"
    usage_decay: float = 0.8
    tracks_usage: ClassVar[bool] = True  # False in policies that override reuse_array
    uses_weights: ClassVar[bool] = False  # True if _update reads the gate weights (callers may skip converting them)
    # host time of an access against oled's, measured at LLaDA2.0-mini's shape (eval/planner_speed.py): replay
    # with a stated planner time charges this part that time x this scale (1: as oled, or cheaper)
    host_cost_scale: ClassVar[float] = 1.0

    def __init__(self, num_layers: int, num_experts: int, **knobs: Any) -> None:
        if knobs:
            raise ValueError(f"retention {self.name!r} has no knob(s) {', '.join(sorted(knobs))}; known: "
                             f"{', '.join(known_knobs(type(self))) or 'none'}")
        self.num_layers = int(num_layers)
        self.num_experts = int(num_experts)
        self.capacities: list[int] | None = None
        self._usage = np.zeros((self.num_layers, self.num_experts))

    @classmethod
    def from_config(cls, num_layers: int, num_experts: int, config: Any) -> CachePolicy:
        return cls(num_layers, num_experts)

    def set_capacities(self, capacities: list[int]) -> None:
        self.capacities = capacities

    # ------------------------------------------------------------------ routing
    def observe_access(
        self, layer: int, topk_ids: Any, topk_weights: Any, clock: int, counts: np.ndarray | None = None
    ) -> None:
        """Routing of one MoE layer access ([T, k] ids and gate weights); called before planning.

        ``counts`` (tokens per expert) may be passed by a caller that has it already.
        """
        ids = as_numpy(topk_ids)
        if ids.ndim == 1:
            ids = ids.reshape(-1, 1)
        if counts is None:
            counts = np.bincount(ids.reshape(-1), minlength=self.num_experts)
        if self.tracks_usage:
            usage = self._usage[layer]
            usage *= self.usage_decay
            np.add(usage, 1.0 - self.usage_decay, out=usage, where=counts > 0)
        self._update(layer, ids, topk_weights, counts, clock)

    def _update(self, layer: int, ids: np.ndarray, weights: Any, counts: np.ndarray, clock: int) -> None:
        """Policy-specific state update; ``counts`` is tokens per expert in this access."""

    # ------------------------------------------------------------------ ranking
    def priority_array(self, layer: int) -> np.ndarray:
        """Float [num_experts], higher = keep. A live view: valid until the next observe call."""
        raise NotImplementedError

    def reuse_array(self, layer: int) -> np.ndarray:
        """Expected number of further accesses that will use each expert (>= 0).

        Default: the run length of a geometric process whose per-access use probability is the
        usage EMA, ``u / (1 - u)``, capped at ``MAX_REUSE``.
        """
        return geometric_reuse(self._usage[layer])

    def reuse_of(self, layer: int, experts: np.ndarray) -> np.ndarray:
        """``reuse_array(layer)[experts]``: the planner asks only for its misses, which a policy
        may compute without materialising the whole array (element-wise, so the same values)."""
        if type(self).reuse_array is not CachePolicy.reuse_array:  # a subclass defines reuse
            return self.reuse_array(layer)[experts]
        return geometric_reuse(self._usage[layer][experts])

    def reuse_inputs(self, layer: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """What the planner (``kernels.plan_access``) needs for this layer's reuse predictions.

        ``(1, reuse row, -, -, -)``: :meth:`reuse_array` (the same values :meth:`reuse_of` gives);
        OLED answers ``(2, -, route ids, class per route, stability per class)`` so that only an
        access that dispatches misses computes its rule.
        """
        return 1, np.asarray(self.reuse_array(layer), dtype=np.float64), NO_INTS, NO_INTS, NO_FLOATS

    def on_admitted(self, layer: int, experts: np.ndarray, clock: int) -> None:
        """Experts copied into ``layer``'s slots ahead of use (a prefetcher's; or already resident and
        wanted). The policy ranks them as it sees fit; the default does nothing."""

    def admission(self, layer: int) -> np.ndarray | None:
        """Bool [num_experts]: experts a miss may copy into a slot; None = all admitted."""
        return None

    def priority(self, layer: int) -> torch.Tensor:
        return torch.from_numpy(self.priority_array(layer))

    def predicted_reuse(self, layer: int) -> torch.Tensor:
        return torch.from_numpy(self.reuse_array(layer))

    def admits(self, layer: int, expert: int) -> bool:
        mask = self.admission(layer)
        return True if mask is None else bool(mask[expert])


def known_knobs(cls: type) -> list[str]:
    """The knobs a policy class takes: its constructors' keyword parameters, up the class chain."""
    names: list[str] = []
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        for p in inspect.signature(init).parameters.values():
            if p.kind is p.POSITIONAL_OR_KEYWORD and p.name not in ("self", "num_layers", "num_experts") \
                    and p.name not in names:
                names.append(p.name)
    return sorted(names)


def geometric_reuse(u: np.ndarray) -> np.ndarray:
    """Expected run of further uses, ``u / (1 - u)`` capped at ``MAX_REUSE``, for use probabilities ``u``
    (``kernels.geometric_reuse``: the rule OLED's reuse ends with too)."""
    return kernels.geometric_reuse(np.asarray(u, dtype=np.float64))


def top_set(scores: np.ndarray, size: int) -> np.ndarray:
    """Bool mask of the ``size`` highest scores; ties go to the lower expert id (deterministic)."""
    mask = np.zeros(scores.shape[0], dtype=bool)
    if size > 0:
        order = np.lexsort((np.arange(scores.shape[0]), -scores))
        mask[order[:size]] = True
    return mask
