"""A system is a composition of four parts: retention x prefetch x dispatch x allocation.

Each part has one interface and knows nothing of the others:

* retention (``policies/``, ``CachePolicy``): which resident experts to keep;
* prefetch (``policies/prefetch.py``, ``Prefetcher``): which experts of the next layer to copy ahead;
* dispatch (``dispatch.py``, ``Dispatcher``): per miss, copy it or compute it on the CPU, and which
  CPU-computed misses to copy for their reuse;
* allocation (``allocation.py``): one uniform split of the slots, or layer-adaptive rebalancing.

A gain is then credited to the part that differs. Grammar of a system string (``--system``)::

    RETENTION [+PREFETCH] [+DISPATCH] [+ALLOCATION]     parts joined by '+', in this order
    RETENTION  = oled | lru | lfu | static | tide | moe-infinity | score | phase | previous-set
                 | adaptive | learned | next-oracle | belady | belady-reuse | lru-reuse | foresight
                 (the last five: oracles, replay only)
    PREFETCH   = none | gate | gate-capped | matrix     (default none)
    DISPATCH   = copy | cpu | cpu+reuse                  (default copy)
    ALLOCATION = uniform | adaptive                      (default uniform)

for example ``lru+cpu+reuse+adaptive`` or ``moe-infinity+matrix+cpu``. A whole string may instead
be a preset name (``SYSTEM_PRESETS``, with the knobs of ``PRESET_KNOBS``): the old policy names
(``oled``, ``lru``, ``prefetch``, ..., as the report ran them) and the published systems the report
compares (``mixtral-offloading``, ``hybrimoe``, ...). Knobs (a tuned TIDE interval, the number of
reuse copies) are not part of the name: they travel beside it in :class:`System.knobs` as
``part.knob`` keys.

One path names a system: ``OffloadConfig(system=...)`` (a preset or parts), replay's ``--system``,
or a :class:`System` handed to :func:`controller.build_controller`. :func:`resolve_system` is the one
function that turns what a config says into a :class:`System`: the ``system`` string, else the
deprecated aliases ``policy``/``layer_adaptive`` (``OffloadConfig`` warns and names the
replacement, :func:`spelling`), with the run-time ``cpu_compute`` and the ``cpu+reuse`` knobs
(``oled_background_copies``/``_min_reuse``) applied to either. An alias and the system it names
therefore plan identically (tested, and by the plan checksums).

This module is naming (grammar, presets, resolution) plus the builders of the parts from a
:class:`System`; it imports no config (``OffloadConfig`` imports it), so the offload modules import
each other in one direction: system <- config -> runtime -> controller / executor.
``OffloadConfig`` refuses a prefetch part or an oracle retention: they run in replay only (the live
executor issues no copies ahead of the plan).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .costmodel import CostModel
from .dispatch import ADMISSIONS, DISPATCH_MODES, Dispatcher
from .online_calibration import CALIBRATION_KNOBS, settings_from_knobs
from .policies import make_policy, make_prefetcher
from .policies.prefetch import PREFETCHERS, Prefetcher

RETENTIONS = ("oled", "lru", "lfu", "static", "tide", "moe-infinity", "score", "phase", "previous-set",
              "adaptive", "learned", "next-oracle", "belady", "belady-reuse", "lru-reuse", "foresight")
# oracles of the report's ladder: they read the trace's future
REPLAY_ONLY_RETENTIONS = ("next-oracle", "belady", "belady-reuse", "lru-reuse", "foresight")
ALLOCATIONS = ("uniform", "adaptive")
KNOB_PARTS = ("retention", "prefetch", "dispatch")
# retention parts whose knobs an OffloadConfig carries (``make_policy(name, ..., config)``); others
# ("score") are built from the registry with their system knobs
_CONFIG_POLICIES = ("lfu", "lru", "moe-infinity", "oled", "static", "tide")
# the deprecated ``policy`` alias's names (config.KNOWN_POLICIES, which re-checks them: the config imports this module)
LEGACY_POLICIES = ("lfu", "lru", "moe-infinity", "oled", "prefetch", "static", "tide")

DEFAULT_SYSTEM = "default"  # what OffloadConfig() runs when no system (and no deprecated alias) names one
SYSTEM_PRESETS: dict[str, str] = {
    # the fastest system on the dev traces (eval/default_system.md): learned retention with oled's dispatch
    # and allocation; OffloadConfig() with no system runs it, and this name always names it
    "default": "learned+cpu+reuse+adaptive",
    "default-uniform": "learned+cpu+reuse+uniform",  # what OffloadConfig(layer_adaptive=False) names
    # the old policy names, as the report ran them; "oled" stays the paper's method
    "oled": "oled+cpu+reuse+adaptive",
    "lru": "lru+copy+uniform",
    "lfu": "lfu+copy+uniform",
    "static": "static+cpu+uniform",
    "tide": "tide+cpu+uniform",
    "oled-uniform": "oled+cpu+reuse+uniform",  # what the old layer_adaptive=False ran
    "prefetch": "lru+gate+copy+uniform",
    "moe-infinity": "moe-infinity+matrix+copy+uniform",
    # published systems, as their papers build them
    "mixtral-offloading": "lru+copy+uniform",
    "hybrimoe": "score+gate-capped+cpu+uniform",
    "ktransformers": "static+cpu+uniform",
    "moe-infinity+cpu": "moe-infinity+matrix+cpu+uniform",
    "promoe": "lru+gate-capped+copy+uniform",
    # the strongest compositions of our own parts
    "lru-full": "lru+cpu+reuse+adaptive",
    "lfu-full": "lfu+cpu+reuse+adaptive",
}
# knobs a preset carries beside its parts (a parts string alone runs without them). ``oled``: its
# dispatcher charges CPU experts at the host-DRAM rate the copy engine leaves them (issue 36: 5-8 %
# lower TPOT at 25-40 % with DRAM at 100 GB/s on the mini-like workload; at the H200 preset's 200 GB/s
# the rate is exactly the unshared one, so its plans, and their checksums, do not change)
PRESET_KNOBS: dict[str, dict[str, Any]] = {"default": {"dispatch.shared_dram": True},
                                           "default-uniform": {"dispatch.shared_dram": True},
                                           "oled": {"dispatch.shared_dram": True},
                                           "oled-uniform": {"dispatch.shared_dram": True}}


@dataclass
class System:
    """The four parts of a system, plus the knobs of its parts (``{"dispatch.reuse_copies": 4}``)."""

    retention: str
    prefetch: str = "none"
    dispatch: str = "copy"
    allocation: str = "uniform"
    knobs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, value, allowed in (("retention", self.retention, RETENTIONS),
                                     ("prefetch", self.prefetch, PREFETCHERS),
                                     ("dispatch", self.dispatch, DISPATCH_MODES),
                                     ("allocation", self.allocation, ALLOCATIONS)):
            if value not in allowed:
                raise ValueError(f"system {name}={value!r} is unknown; allowed: {', '.join(allowed)}")
        for key in self.knobs:
            part = key.split(".", 1)[0]
            if "." not in key or part not in KNOB_PARTS:
                raise ValueError(f"system knob {key!r} is invalid: must be PART.NAME with PART one of "
                                 f"{', '.join(KNOB_PARTS)}")

    @property
    def parts(self) -> str:
        """The canonical name: all four parts (``lru+none+copy+uniform``)."""
        return "+".join((self.retention, self.prefetch, self.dispatch, self.allocation))

    @property
    def layer_adaptive(self) -> bool:
        return self.allocation == "adaptive"

    @property
    def cpu_compute(self) -> str:
        return "off" if self.dispatch == "copy" else "on"

    def part_knobs(self, part: str) -> dict[str, Any]:
        return {k.split(".", 1)[1]: v for k, v in self.knobs.items() if k.split(".", 1)[0] == part}

    def with_knobs(self, **knobs: Any) -> System:
        """A copy with knobs added (``dispatch__reuse_copies=4`` or ``{"dispatch.reuse_copies": 4}``)."""
        extra = {k.replace("__", ".", 1): v for k, v in knobs.items()}
        return dataclasses.replace(self, knobs={**self.knobs, **extra})

    def knob_text(self) -> str:
        """Knobs for a table cell (arrays, e.g. a static profile, by their origin only)."""
        out = []
        for k, v in sorted(self.knobs.items()):
            name = k.split(".", 1)[1]
            out.append(f"{name}={v:g}" if isinstance(v, float) else f"{name}={v}" if isinstance(v, (int, str))
                       else f"{name}=<dev profile>")
        return ", ".join(out) or "-"


def _grammar() -> str:
    return (f"RETENTION[+PREFETCH][+DISPATCH][+ALLOCATION] with RETENTION one of {', '.join(RETENTIONS)}; "
            f"PREFETCH one of {', '.join(PREFETCHERS)}; DISPATCH one of {', '.join(DISPATCH_MODES)}; "
            f"ALLOCATION one of {', '.join(ALLOCATIONS)}; or a preset: {', '.join(SYSTEM_PRESETS)}")


def parse_system(text: str) -> System:
    """A system from its name (a preset, or parts joined by '+', see the module docstring)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"system={text!r} is invalid: expected {_grammar()}")
    bad = f"system={text!r} is invalid"  # every message names the string as given
    text = text.strip()
    preset_knobs = PRESET_KNOBS.get(text, {})
    if text in SYSTEM_PRESETS:
        text = SYSTEM_PRESETS[text]
    tokens = text.split("+")
    # "cpu+reuse" is one dispatch part spelt with a '+'
    merged: list[str] = []
    for tok in tokens:
        if tok == "reuse" and merged and merged[-1] == "cpu":
            merged[-1] = "cpu+reuse"
        else:
            merged.append(tok)
    if merged[0] not in RETENTIONS:
        raise ValueError(f"{bad}: the first part must be a retention policy ({', '.join(RETENTIONS)}), "
                         f"got {merged[0]!r}; expected {_grammar()}")
    parts: dict[str, str] = {"retention": merged[0]}
    order = [("prefetch", PREFETCHERS), ("dispatch", DISPATCH_MODES), ("allocation", ALLOCATIONS)]
    pos = 0
    for tok in merged[1:]:
        for i, (name, allowed) in enumerate(order):
            if tok in allowed:
                if i < pos or name in parts:
                    raise ValueError(f"{bad}: part {tok!r} ({name}) is repeated or out of order; "
                                     f"expected {_grammar()}")
                parts[name], pos = tok, i + 1
                break
        else:
            hint = " ('reuse' follows 'cpu': cpu+reuse)" if tok == "reuse" else ""
            raise ValueError(f"{bad}: unknown part {tok!r}{hint}; expected {_grammar()}")
    return System(**parts, knobs=dict(preset_knobs))


def resolve_system(system: str | System | None = None, *, policy: str | None = None, cpu_compute: str = "auto",
                   layer_adaptive: bool = True, reuse_copies: int = 2, reuse_min: float = 1.0) -> System:
    """The one place a system is resolved from what names it: ``system``, else the legacy aliases, else the default.

    ``system``: a name (a preset or parts, :func:`parse_system`) or a :class:`System`; it is the
    source of truth. None and no ``policy``: the ``default`` preset (``DEFAULT_SYSTEM``), on the
    allocation ``layer_adaptive`` names. None with ``policy``: the deprecated aliases name it, as the old
    ``OffloadConfig`` fields did:
    ``policy`` the retention (``prefetch`` is lru with the gate prefetcher, ``moe-infinity`` has the
    activation-matrix prefetcher), a CPU dispatch unless ``cpu_compute="off"`` (``oled``'s with reuse
    copies and the oled preset's knobs), and ``layer_adaptive`` the allocation.

    Whatever named it: ``cpu_compute="off"`` (what the live runtime passes where the device is the
    CPU, where CPU compute saves nothing) makes the dispatch ``copy`` (which has no knobs); ``reuse_copies`` and
    ``reuse_min`` (``OffloadConfig.oled_background_copies``/``_min_reuse``) are the knobs of a
    ``cpu+reuse`` dispatch, recorded where not at their defaults; 0 copies is the dispatch ``cpu``.
    """
    if system is None and policy is None:
        system = parse_system(DEFAULT_SYSTEM if layer_adaptive else f"{DEFAULT_SYSTEM}-uniform")
    if system is None:
        if policy not in LEGACY_POLICIES:
            raise ValueError(f"policy={policy!r} is unknown; known policies: {', '.join(LEGACY_POLICIES)}")
        prefetch = {"prefetch": "gate", "moe-infinity": "matrix"}.get(policy, "none")
        retention = "lru" if policy == "prefetch" else policy
        if cpu_compute == "off":
            dispatch = "copy"
        elif policy == "oled" and reuse_copies > 0:
            dispatch = "cpu+reuse"
        else:
            dispatch = "cpu"
        knobs = PRESET_KNOBS["oled"] if policy == "oled" and dispatch != "copy" else {}
        resolved = System(retention, prefetch, dispatch, "adaptive" if layer_adaptive else "uniform", dict(knobs))
    else:
        resolved = parse_system(system) if isinstance(system, str) else system
        if cpu_compute == "off" and resolved.dispatch != "copy":  # a copy dispatch has no knobs
            resolved = dataclasses.replace(resolved, dispatch="copy", knobs={
                k: v for k, v in resolved.knobs.items() if not k.startswith("dispatch.")})
        if resolved.dispatch == "cpu+reuse" and reuse_copies == 0:
            resolved = dataclasses.replace(resolved, dispatch="cpu")
    if resolved.dispatch == "cpu+reuse" and int(reuse_copies) != 2:
        resolved = resolved.with_knobs(dispatch__reuse_copies=int(reuse_copies))
    if resolved.dispatch == "cpu+reuse" and float(reuse_min) != 1.0:
        resolved = resolved.with_knobs(dispatch__reuse_min=float(reuse_min))
    return resolved


def system_of_legacy(policy: str, cpu_compute: str = "auto", layer_adaptive: bool = True,
                     reuse_copies: int = 2) -> System:
    """The system an old ``--policy`` name runs (:func:`resolve_system` of the aliases alone).

    Kept as a name for the callers that label replays by the old policy names (``sim.replay.compare``).
    """
    return resolve_system(None, policy=policy, cpu_compute=cpu_compute, layer_adaptive=layer_adaptive,
                          reuse_copies=reuse_copies)


def spelling(system: System) -> str:
    """The shortest name of ``system``: a preset with its exact parts and knobs, else its parts without
    the defaults (``lru+cpu+adaptive``). Deprecation messages name the replacement with it."""
    for name in SYSTEM_PRESETS:
        if parse_system(name) == system:
            return name
    parts = [system.retention] + [p for p, default in ((system.prefetch, "none"), (system.dispatch, "copy"))
                                  if p != default] + [system.allocation]
    return "+".join(parts)


def build_dispatcher(system: System, cost_model: CostModel | None) -> Dispatcher:
    """The dispatch part, deciding from ``cost_model`` (the believed one).

    ``dispatch.calibrate=1`` (and its ``calibrate_*`` tuning, ``online_calibration.CALIBRATION_KNOBS``)
    attaches an online calibrator that corrects the belief from what the run measures (the live
    executor feeds it; replay strips these knobs and attaches its own, ``sim.replay.split_calibration``).
    The knobs are validated whatever the dispatch; a ``copy`` dispatch reads no cost, so it is not calibrated.
    """
    dk = system.part_knobs("dispatch")
    known = ("reuse_copies", "reuse_min", "shared_dram", "admission", *CALIBRATION_KNOBS)
    unknown = set(dk) - set(known)
    if unknown:
        raise ValueError(f"unknown dispatch knob(s): {', '.join(sorted(unknown))}; known: {', '.join(known)}")
    shared = dk.get("shared_dram", False)
    if not isinstance(shared, (bool, int)) or shared not in (0, 1):
        raise ValueError(f"dispatch knob shared_dram={shared!r} is invalid: must be true or false")
    calibration = settings_from_knobs(dk)
    admission = dk.get("admission", "all")
    if admission not in ADMISSIONS:
        raise ValueError(f"dispatch knob admission={admission!r} is unknown; allowed: {', '.join(ADMISSIONS)}")
    d = Dispatcher.for_mode(system.dispatch, cost_model, reuse_copies=int(dk.get("reuse_copies", 2)),
                            reuse_min=float(dk.get("reuse_min", 1.0)), shared_dram=bool(shared),
                            admission=admission)
    if calibration is not None and d.cpu_enabled:
        d.enable_calibration(calibration)
    return d


def build_policy(system: System, num_layers: int, num_experts: int, knobs: Any = None):
    """The retention part. ``knobs``: an object with the retention knobs as attributes (an
    ``OffloadConfig``'s ``tide_interval``, ``static_warmup_iterations``, ``oled_*``; duck-typed, so
    nothing here imports the config); the system's own retention knobs win over them."""
    rk = system.part_knobs("retention")
    if system.retention in _CONFIG_POLICIES and not rk:
        return make_policy(system.retention, num_layers, num_experts, knobs)
    from .policies.base import _REGISTRY

    if knobs is not None and system.retention == "static":
        rk = {"warmup_iterations": knobs.static_warmup_iterations, **rk}
    if knobs is not None and system.retention == "tide":
        rk = {"interval": knobs.tide_interval, **rk}
    return _REGISTRY[system.retention](num_layers, num_experts, **rk)


def build_prefetcher(system: System, num_layers: int, num_experts: int) -> Prefetcher | None:
    return make_prefetcher(system.prefetch, num_layers, num_experts, **system.part_knobs("prefetch"))
