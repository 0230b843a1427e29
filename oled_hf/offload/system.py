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
                 | value | mix | next-oracle | belady                     (the last two: oracles, replay only)
    PREFETCH   = none | gate | gate-capped | matrix     (default none)
    DISPATCH   = copy | cpu | cpu+reuse                  (default copy)
    ALLOCATION = uniform | adaptive                      (default uniform)

for example ``lru+cpu+reuse+adaptive`` or ``moe-infinity+matrix+cpu``. A whole string may instead
be a preset name (``SYSTEM_PRESETS``, with the knobs of ``PRESET_KNOBS``): the old policy names
(``oled``, ``lru``, ``prefetch``, ..., as the report ran them) and the published systems the report
compares (``mixtral-offloading``, ``hybrimoe``, ...). Knobs (a tuned TIDE interval, the number of
reuse copies) are not part of the name: they travel beside it in :class:`System.knobs` as
``part.knob`` keys.

The controller the live runtime and replay share builds its parts from a system: the config's
(:func:`system_of_config`: ``OffloadConfig.system``, else the legacy ``policy``/``cpu_compute``/
``layer_adaptive`` fields) or one handed to it (:func:`controller.build_controller`, replay's ``--system``,
whose knobs a config string cannot carry). A legacy config and the system of its parts
(``system_of_legacy``) therefore plan identically (tested, and by the plan checksums).
``OffloadConfig`` validates its ``system`` with :func:`parse_system` and refuses a prefetch part:
prefetchers run in replay only (the live executor issues no copies ahead of the plan).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .costmodel import CostModel
from .dispatch import DISPATCH_MODES, Dispatcher
from .policies import make_policy, make_prefetcher
from .policies.prefetch import PREFETCHERS, Prefetcher

if TYPE_CHECKING:
    from .config import OffloadConfig

RETENTIONS = ("oled", "lru", "lfu", "static", "tide", "moe-infinity", "score", "phase", "previous-set",
              "value", "mix", "next-oracle", "belady")
REPLAY_ONLY_RETENTIONS = ("next-oracle", "belady")  # oracles of the report's ladder: they read the trace's future
ALLOCATIONS = ("uniform", "adaptive")
KNOB_PARTS = ("retention", "prefetch", "dispatch")
# retention parts an OffloadConfig's ``policy`` can name (config.KNOWN_POLICIES less the legacy "prefetch");
# others ("score") are built from the registry with their system knobs
_CONFIG_POLICIES = ("lfu", "lru", "moe-infinity", "oled", "static", "tide")

SYSTEM_PRESETS: dict[str, str] = {
    # the old policy names, as the report ran them
    "oled": "oled+cpu+reuse+adaptive",
    "lru": "lru+copy+uniform",
    "lfu": "lfu+copy+uniform",
    "static": "static+cpu+uniform",
    "tide": "tide+cpu+uniform",
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
PRESET_KNOBS: dict[str, dict[str, Any]] = {"oled": {"dispatch.shared_dram": True}}


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


def system_of_legacy(policy: str, cpu_compute: str = "auto", layer_adaptive: bool = True,
                     reuse_copies: int = 2) -> System:
    """The parts a legacy ``(policy, cpu_compute, layer_adaptive)`` config runs (old ``--policy`` flags).

    ``reuse_copies``: ``OffloadConfig.oled_background_copies`` (only ``oled`` took it).
    """
    prefetch = {"prefetch": "gate", "moe-infinity": "matrix"}.get(policy, "none")
    retention = "lru" if policy == "prefetch" else policy
    if cpu_compute == "off":
        dispatch = "copy"
    elif policy == "oled" and reuse_copies > 0:
        dispatch = "cpu+reuse"
    else:
        dispatch = "cpu"
    knobs = {"dispatch.reuse_copies": int(reuse_copies)} if dispatch == "cpu+reuse" and reuse_copies != 2 else {}
    if policy == "oled" and dispatch != "copy":  # the oled preset's dispatch knobs (PRESET_KNOBS)
        knobs.update(PRESET_KNOBS["oled"])
    return System(retention, prefetch, dispatch, "adaptive" if layer_adaptive else "uniform", knobs)


def system_of_config(config: OffloadConfig) -> System:
    """The system an OffloadConfig runs: its ``system`` string if it has one, else the legacy
    ``policy``/``cpu_compute``/``layer_adaptive`` fields (``system_of_legacy``).

    ``cpu_compute="off"`` (what the live runtime passes where the device is the CPU) makes the
    dispatch ``copy`` whatever the system says: on such a machine CPU compute saves nothing.
    ``oled_background_copies``/``oled_background_min_reuse`` are the knobs of a ``cpu+reuse``
    dispatch (named for the preset that had them first): ``reuse_copies``/``reuse_min``, where not
    at their defaults; 0 copies is the dispatch ``cpu``.
    """
    copies, min_reuse = int(config.oled_background_copies), float(config.oled_background_min_reuse)
    text = getattr(config, "system", None)
    if text:
        system = parse_system(text)
        if config.cpu_compute == "off" and system.dispatch != "copy":
            system = dataclasses.replace(system, dispatch="copy")
        if system.dispatch == "cpu+reuse" and copies == 0:
            system = dataclasses.replace(system, dispatch="cpu")
        elif system.dispatch == "cpu+reuse" and copies != 2:
            system = system.with_knobs(dispatch__reuse_copies=copies)
    else:
        system = system_of_legacy(config.policy, config.cpu_compute, config.layer_adaptive, copies)
    if system.dispatch == "cpu+reuse" and min_reuse != 1.0:
        system = system.with_knobs(dispatch__reuse_min=min_reuse)
    return system


def legacy_config_fields(system: System) -> dict[str, Any]:
    """OffloadConfig fields that express as much of the system as a config's legacy fields can.

    ``system`` is cleared: a controller given a :class:`System` builds from it, not from a string
    (a config may not name both a system and a non-default policy).
    """
    policy = system.retention if system.retention in _CONFIG_POLICIES else "lru"
    out: dict[str, Any] = {"system": None, "policy": policy, "cpu_compute": system.cpu_compute,
                           "layer_adaptive": system.layer_adaptive}
    rk = system.part_knobs("retention")
    if system.retention == "tide" and "interval" in rk:
        out["tide_interval"] = int(rk["interval"])
    if system.retention == "static" and "warmup_iterations" in rk:
        out["static_warmup_iterations"] = int(rk["warmup_iterations"])
    return out


def build_dispatcher(system: System, cost_model: CostModel | None) -> Dispatcher:
    """The dispatch part, deciding from ``cost_model`` (the believed one)."""
    dk = system.part_knobs("dispatch")
    unknown = set(dk) - {"reuse_copies", "reuse_min", "admit", "shared_dram"}
    if unknown:
        raise ValueError(f"unknown dispatch knob(s): {', '.join(sorted(unknown))}; known: reuse_copies, reuse_min, "
                         "admit, shared_dram")
    flags = {}
    for name in ("admit", "shared_dram"):
        v = dk.get(name, False)
        if not isinstance(v, (bool, int)) or v not in (0, 1):
            raise ValueError(f"dispatch knob {name}={v!r} is invalid: must be true or false")
        flags[name] = bool(v)
    return Dispatcher.for_mode(system.dispatch, cost_model, reuse_copies=int(dk.get("reuse_copies", 2)),
                               reuse_min=float(dk.get("reuse_min", 1.0)), **flags)


def build_policy(system: System, num_layers: int, num_experts: int, config: OffloadConfig):
    """The retention part: from the config's knobs where the config names it, else from the system's knobs."""
    rk = system.part_knobs("retention")
    config_knobs = {"interval", "warmup_iterations"}
    if system.retention in _CONFIG_POLICIES and not set(rk) - config_knobs:
        return make_policy(system.retention, num_layers, num_experts, config)
    from .policies.base import _REGISTRY

    if system.retention == "static":
        rk = {"warmup_iterations": config.static_warmup_iterations, **rk}
    if system.retention == "tide":
        rk = {"interval": config.tide_interval, **rk}
    return _REGISTRY[system.retention](num_layers, num_experts, **rk)


def build_prefetcher(system: System, num_layers: int, num_experts: int) -> Prefetcher | None:
    return make_prefetcher(system.prefetch, num_layers, num_experts, **system.part_knobs("prefetch"))
