"""OffloadConfig: every user-facing knob of expert offloading, validated on construction.

The config is a plain dataclass that round-trips through JSON. It is never written into a model's
``config.json``: offloading is a property of one loaded instance, not of the checkpoint. Checks that
need the model's shape (``cache_size`` against the number of experts) live in :meth:`resolve_slots`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from dataclasses import asdict, dataclass, fields
from numbers import Integral, Real
from typing import TYPE_CHECKING, Any

from .budget import DEFAULT_GPU_MEMORY_UTILIZATION, MaxMemory, parse_max_memory, parse_memory, slots_for_bytes

if TYPE_CHECKING:
    from .system import System

# legacy ``policy`` names; every retention rule, "score" (HybriMoE's) included, is named by ``system``
KNOWN_POLICIES = ("lfu", "lru", "moe-infinity", "oled", "prefetch", "static", "tide")
DEFAULT_POLICY = None  # the deprecated alias not given: the default system (system.DEFAULT_SYSTEM) runs
STORE_MODES = ("auto", "mmap", "pinned")
BUDGETS = ("cache_size", "cache_ratio", "max_gpu_memory")  # exactly one is given
DEFAULT_EMULATED_LATENCY_US = 5.0  # the emulated link's per-copy latency when emulated_latency_us is None
EMULATED_FIELDS = ("emulated_bandwidth_gbps", "emulated_latency_us", "emulated_memory")  # device='emulated' only
AUTO = "auto"  # cache_ratio="auto": sized from free GPU memory at load (budget.py)


def _is_int(value: Any) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(float(value))


@dataclass
class OffloadConfig:
    """How experts are offloaded. Give exactly one budget: ``cache_size``, ``cache_ratio`` or ``max_gpu_memory``.

    ``cache_size`` counts expert slots per MoE layer on average (the paper's unit: 40 or 100 of 256
    for LLaDA2.0-mini); ``cache_ratio`` is the fraction of all routed-expert bytes kept on the GPU,
    or ``"auto"``: as many slots as free GPU memory holds once the weights are loaded, after
    activations and KV for ``auto_batch_size`` sequences of ``auto_context_length`` tokens, keeping
    ``1 - gpu_memory_utilization`` of the device free (vLLM's rule; formula in
    ``oled_hf/offload/budget.py``; needs a CUDA device). ``max_gpu_memory`` caps the slot pool's
    device bytes (``"20GiB"``, ``"20GB"``, ``"500MiB"`` or an int of bytes, as accelerate's
    ``max_memory``). ``gpu_memory_utilization``, ``auto_batch_size`` and ``auto_context_length``
    are read only with ``cache_ratio="auto"``.
    ``max_memory``: accelerate's dict (``{0: "20GiB", "cpu": "60GiB"}``, what ``from_pretrained(...,
    max_memory=...)`` hands in). Its device entry is the device's whole budget, non-expert weights
    included: alone it is the budget (the pool gets what the non-expert weights leave), beside
    ``cache_size``/``cache_ratio``/``max_gpu_memory`` it caps them (refused at load if exceeded).
    Its ``"cpu"`` entry caps host memory: a pinned store that would pass it becomes ``store="mmap"``
    (the experts are read from the shard files, page cache the kernel can drop), or is refused with
    ``store="pinned"``; on a CPU device the weights and the cache count too. Resolved at load
    (:meth:`attach`), where the non-expert weights' size is known.
    The budget is never enlarged: one that gives a layer fewer than ``min_slots_per_layer`` slots
    is refused at load (:meth:`resolve_slots`), as is a pool larger than the device's free memory.
    Cost-model overrides replace the values measured at load (``calibrate``) or the preset.
    ``calibrate_online``: a dispatch with CPU compute then corrects its copy and CPU costs during the
    run from measured times (the dispatch knob ``calibrate=1``, ``oled_hf/offload/online_calibration.py``):
    it changes only where misses are served, never the tokens. Off by default.
    ``admission="priority"``: a miss the dispatch would copy takes a slot only if the retention part ranks it
    above the resident it would evict; otherwise it runs on the CPU (the dispatch knob ``admission``,
    ``oled_hf/offload/dispatch.py``; no effect where CPU compute is off). ``"all"`` (the default) admits every copy.

    ``system``: the system to run (``oled_hf/offload/system.py``), the one way to name it: a preset
    (``"default"``, what None runs: the fastest system on the dev traces, learned retention with OLED-MoE's
    dispatch and allocation; ``"oled"``, the paper's method; ``"lru-full"``, ``"mixtral-offloading"``, ...) or parts
    ``RETENTION[+PREFETCH][+DISPATCH][+ALLOCATION]`` (``"lru+cpu+reuse+adaptive"``). The live prefetch
    parts (``previous``, ``matrix``) run; the gate prefetchers (which read predicted routes) and the
    oracle retentions are refused: they run in replay only (``oled-moe trace replay --system``).
    ``policy`` and ``layer_adaptive`` are deprecated aliases of the retention and the allocation
    (a FutureWarning names the ``system=`` spelling; both resolved by ``system.resolve_system``).
    Beside the name, whatever names it: ``cpu_compute="off"`` (or ``"auto"`` on a CPU-only device)
    turns every miss into a copy; ``oled_background_copies``/``oled_background_min_reuse`` are the
    knobs of a ``cpu+reuse`` dispatch (0 copies: ``cpu``). :meth:`resolved_system` gives the result.

    ``record_trace``: a file the routing trace of the loaded model is written to; one trace per
    load, holding every ``generate`` of that model in order (a sequence each), rewritten whole
    (atomically) after each ``generate``. Its folder must exist (none is created), the path must
    not be a folder, and an existing file is refused unless ``record_trace_overwrite=True``;
    all checked when the model loads (:meth:`attach`), before any expert is read.

    One loaded model runs one call at a time: ``generate`` and forwards from several threads
    are serialised by a per-model lock (see ``oled_hf/offload/runtime.py``); ``offload_stats()``
    from another thread does not wait and returns the figures of the last finished ``generate``.
    """

    cache_size: int | None = None
    cache_ratio: float | str | None = None  # or "auto": sized from free GPU memory at load
    max_gpu_memory: int | str | None = None  # device bytes for the expert slot pool: "20GiB", 20 * 2**30
    max_memory: dict | None = None  # accelerate's {0: "20GiB", "cpu": "60GiB"}: device total and host cap
    # read only with cache_ratio="auto" (oled_hf/offload/budget.py)
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    auto_batch_size: int = 1
    auto_context_length: int | None = None  # None: the model's max_position_embeddings
    policy: str | None = DEFAULT_POLICY  # deprecated alias of system= (the retention part)
    system: str | None = None  # "lru+cpu+reuse+adaptive" or a preset; None: "default" (see the docstring)
    layer_adaptive: bool = True  # deprecated alias of system=...+uniform (the allocation part)
    cpu_compute: str = "auto"
    store: str = "auto"
    calibrate: bool = True
    calibrate_online: bool = False  # the dispatcher corrects its belief from measured times (dispatch.calibrate=1)
    admission: str = "all"  # "priority": a copy must outrank the resident it evicts (dispatch.admission)
    # cost-model overrides (None = measured at load, or the preset)
    h2d_bandwidth_gbps: float | None = None
    cpu_bandwidth_gbps: float | None = None
    cpu_expert_ms_per_token: float | None = None
    gpu_expert_ms_per_token: float | None = None
    gpu_expert_fixed_ms: float | None = None
    # policy knobs
    tide_interval: int = 4
    static_warmup_iterations: int = 8
    oled_confidence_threshold: float = 0.9
    oled_decay: float = 0.5
    oled_block_decay: float = 0.25
    oled_min_stability: float = 0.05
    oled_gate_power: float = 0.5
    oled_frequency_weight: float = 0.0
    oled_frequency_decay: float = 0.99
    oled_background_copies: int = 2  # reuse copies per access of CPU-computed misses (planner rule 4)
    oled_background_min_reuse: float = 1.0
    # layer-adaptive allocation knobs
    rebalance_damping: float = 0.5
    min_slots_per_layer: int = 1
    record_trace: str | None = None
    record_trace_overwrite: bool = False  # replace an existing record_trace file (else refused)
    # where the slot pool lives: "auto" the model's device; "emulated" the emulated asynchronous
    # device (oled_hf/offload/device.py: a budgeted pool, copies timed on a worker thread)
    device: str = "auto"
    emulated_bandwidth_gbps: float | None = None  # None: the expert copies in PCIe 5's time for mini's expert
    emulated_latency_us: float | None = None  # None: DEFAULT_EMULATED_LATENCY_US
    emulated_memory: int | str | None = None  # the emulated device's memory; None: what the pool needs

    def __post_init__(self) -> None:
        # here, not at the top: the command line reads KNOWN_POLICIES for its --help without numpy and numba
        from .dispatch import ADMISSIONS, CPU_COMPUTE_MODES

        self._check_budget()
        if self.policy is not None:
            self._check_choice("policy", KNOWN_POLICIES, "known policies")
        self._check_choice("cpu_compute", CPU_COMPUTE_MODES, "allowed")
        self._check_choice("store", STORE_MODES, "allowed")
        self._check_choice("admission", ADMISSIONS, "allowed")
        for name in ("layer_adaptive", "calibrate", "calibrate_online", "record_trace_overwrite"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} is invalid: must be True or False")
        for name in ("h2d_bandwidth_gbps", "cpu_bandwidth_gbps", "cpu_expert_ms_per_token",
                     "gpu_expert_ms_per_token", "gpu_expert_fixed_ms"):
            value = getattr(self, name)
            if value is not None and (not _is_real(value) or float(value) <= 0.0):
                raise ValueError(f"{name}={value!r} is invalid: must be a number > 0, or None to measure it")
        for name in ("tide_interval", "static_warmup_iterations", "min_slots_per_layer", "auto_batch_size"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"{name}={value!r} is invalid: must be an integer >= 1")
        self._check_unit("oled_confidence_threshold", low_open=True)
        self._check_unit("oled_decay", low_open=False)
        self._check_unit("oled_block_decay", low_open=False)
        self._check_unit("oled_min_stability", low_open=True)
        self._check_unit("oled_frequency_decay", low_open=False)
        if not _is_int(self.oled_background_copies) or int(self.oled_background_copies) < 0:
            raise ValueError(f"oled_background_copies={self.oled_background_copies!r} is invalid: must be an int >= 0")
        if not _is_real(self.oled_background_min_reuse) or float(self.oled_background_min_reuse) < 0:
            raise ValueError(f"oled_background_min_reuse={self.oled_background_min_reuse!r} is invalid: "
                             "must be a number >= 0")
        if not _is_real(self.oled_frequency_weight) or float(self.oled_frequency_weight) < 0:
            raise ValueError(f"oled_frequency_weight={self.oled_frequency_weight!r} is invalid: must be a number >= 0")
        self._check_unit("rebalance_damping", low_open=True)
        if not _is_real(self.oled_gate_power) or not 0.0 <= float(self.oled_gate_power) <= 4.0:
            raise ValueError(f"oled_gate_power={self.oled_gate_power!r} is invalid: must be a number in [0, 4]")
        if self.auto_context_length is not None and (not _is_int(self.auto_context_length)
                                                     or self.auto_context_length < 1):
            raise ValueError(f"auto_context_length={self.auto_context_length!r} is invalid: must be an integer >= 1, "
                             "or None for the model's max_position_embeddings")
        self._check_unit("gpu_memory_utilization", low_open=True)
        if self.record_trace is not None and (not isinstance(self.record_trace, str) or not self.record_trace):
            raise ValueError(f"record_trace={self.record_trace!r} is invalid: must be a file path or None")
        self._check_device()
        self._check_system()
        self._warn_aliases()

    def _check_device(self) -> None:
        """``device`` and the emulated link; the emulated fields only with ``device='emulated'``."""
        self._check_choice("device", ("auto", "emulated"), "allowed")
        bw, lat = self.emulated_bandwidth_gbps, self.emulated_latency_us
        if bw is not None and (not _is_real(bw) or not math.isfinite(float(bw)) or float(bw) <= 0.0):
            raise ValueError(f"emulated_bandwidth_gbps={bw!r} is invalid: must be a finite number of GB/s > 0, "
                             "or None for the default (an expert copies in the time PCIe 5 copies mini's)")
        if lat is not None and (not _is_real(lat) or not 0.0 <= float(lat) <= 1e6):
            raise ValueError(f"emulated_latency_us={lat!r} is invalid: must be a number of microseconds in [0, 1e6], "
                             f"or None for {DEFAULT_EMULATED_LATENCY_US:g}")
        if self.emulated_memory is not None:
            parse_memory(self.emulated_memory, "emulated_memory")
        given = [f"{name}={getattr(self, name)!r}" for name in EMULATED_FIELDS if getattr(self, name) is not None]
        if self.device != "emulated" and given:  # silently ignored before: a run the user did not ask for
            raise ValueError(f"{', '.join(given)}: the emulated link's fields ({', '.join(EMULATED_FIELDS)}) apply to "
                             f"device='emulated' only, and device={self.device!r}; add device='emulated' or drop them")

    def emulated_device(self, expert_bytes: int):
        """The emulated device this config names (None for ``device='auto'``), its link checked."""
        if self.device != "emulated":
            return None
        from .device import EmulatedDevice, default_bandwidth

        bw = default_bandwidth(expert_bytes) if self.emulated_bandwidth_gbps is None \
            else float(self.emulated_bandwidth_gbps) * 1e9
        memory = None if self.emulated_memory is None else parse_memory(self.emulated_memory, "emulated_memory")
        latency = DEFAULT_EMULATED_LATENCY_US if self.emulated_latency_us is None else float(self.emulated_latency_us)
        return EmulatedDevice(bw, latency * 1e-6, memory)

    def resolved_system(self, cpu_compute: str | None = None) -> System:
        """The :class:`~oled_hf.offload.system.System` this config runs (``system.resolve_system``).

        ``cpu_compute``: the mode the run resolved for its device (the runtime passes ``"off"`` where
        the device is the CPU); None: this config's ``cpu_compute``.
        """
        from .system import resolve_system

        resolved = resolve_system(self.system, policy=self.policy, layer_adaptive=self.layer_adaptive,
                                  cpu_compute=self.cpu_compute if cpu_compute is None else cpu_compute,
                                  reuse_copies=int(self.oled_background_copies),
                                  reuse_min=float(self.oled_background_min_reuse))
        if self.calibrate_online and resolved.dispatch != "copy":  # a copy dispatch reads no cost
            resolved = resolved.with_knobs(dispatch__calibrate=1)
        if self.admission != "all" and resolved.dispatch != "copy":  # every miss is copied there
            resolved = resolved.with_knobs(dispatch__admission=self.admission)
        return resolved

    def _warn_aliases(self) -> None:
        """A FutureWarning naming the ``system=`` spelling of the deprecated aliases given."""
        given = [f"{name}={getattr(self, name)!r}" for name, default in (("policy", DEFAULT_POLICY),
                                                                          ("layer_adaptive", True))
                 if getattr(self, name) != default]
        if not given:
            return
        from .system import resolve_system, spelling

        if self.system is not None:  # policy is refused beside a system: only a redundant '+uniform' remains
            advice = f"the system {self.system!r} names the allocation; drop layer_adaptive"
        else:
            named = resolve_system(None, policy=self.policy, layer_adaptive=self.layer_adaptive)
            advice = f"use system={spelling(named)!r}"
            if named.prefetch != "none":
                live = spelling(dataclasses.replace(named, prefetch="none"))
                advice += (f" in replay (oled-moe trace replay --system; its prefetch part {named.prefetch!r} runs "
                           f"in replay only), system={live!r} for a live run (which runs no prefetcher)")
        warnings.warn(f"OffloadConfig({', '.join(given)}) is deprecated and will be removed: {advice} "
                      "(policy and layer_adaptive are aliases of the system's retention and allocation)",
                      FutureWarning, stacklevel=4)

    def _check_system(self) -> None:
        """A ``system`` the live runtime can run, not contradicted by the legacy fields it replaces."""
        if self.system is None:
            return
        # lazily: system.py imports the policies and the dispatcher, which need not load with a config
        from .policies.prefetch import LIVE_PREFETCHERS, REPLAY_ONLY_PREFETCHERS
        from .system import parse_system

        system = parse_system(self.system)  # "system=... is invalid: ...; expected <grammar and presets>"
        if self.policy != DEFAULT_POLICY:
            raise ValueError(f"policy={self.policy!r} and system={self.system!r} are both given: the system names "
                             f"the retention policy (its first part, here {system.retention!r}); give no policy "
                             "(it is a deprecated alias) or no system")
        if system.prefetch in REPLAY_ONLY_PREFETCHERS:
            raise ValueError(f"system={self.system!r} is invalid for a live run: its prefetch part "
                             f"{system.prefetch!r} reads the next layer's predicted routes, which only a "
                             f"recorded trace holds (oled-moe trace replay --system); live prefetch parts: "
                             f"{', '.join(LIVE_PREFETCHERS)}, e.g. "
                             f"{'+'.join((system.retention, 'previous', system.dispatch, system.allocation))!r}")
        from .system import REPLAY_ONLY_RETENTIONS

        if system.retention in REPLAY_ONLY_RETENTIONS:
            raise ValueError(f"system={self.system!r} is invalid for a live run: its retention "
                             f"{system.retention!r} is an oracle that reads the trace's future (the report's "
                             "ladder); it runs in replay only")
        if system.layer_adaptive and not self.layer_adaptive:
            raise ValueError(f"layer_adaptive=False and system={self.system!r} disagree: the system's allocation "
                             f"is 'adaptive'; name a '+uniform' system or leave layer_adaptive at True")

    def max_memory_entries(self) -> MaxMemory:
        """``max_memory`` parsed (:func:`budget.parse_max_memory`); empty where none is given."""
        return MaxMemory() if self.max_memory is None else parse_max_memory(self.max_memory)

    def with_max_memory(self, max_memory: Any) -> OffloadConfig:
        """This config with ``from_pretrained``'s ``max_memory`` (accelerate's dict), checked; refused if it
        already holds a different one (the budget is given once)."""
        if max_memory is None:
            return self
        if self.max_memory is not None and self.max_memory != max_memory:
            raise ValueError(f"max_memory={max_memory!r} is given to from_pretrained and max_memory="
                             f"{self.max_memory!r} to OffloadConfig: give it once")
        return dataclasses.replace(self, max_memory=dict(max_memory))

    def _check_budget(self) -> None:
        """Exactly one of the three budgets, each valid; the error names the field and what is allowed.

        ``max_memory``'s device entry may stand for them (it is the device's whole budget), or cap one
        of them; beside ``cache_ratio='auto'`` (which sizes the pool from the device too) it is refused.
        """
        if self.max_memory is not None:  # JSON turns {0: ...} into {"0": ...}: the same device
            self.max_memory = {int(k) if isinstance(k, str) and k.isdigit() else k: v
                               for k, v in self.max_memory.items()} if isinstance(self.max_memory, dict) \
                else self.max_memory
        entries = self.max_memory_entries()
        given = [name for name in BUDGETS if getattr(self, name) is not None]
        if entries.device is not None and self.cache_ratio == AUTO:
            raise ValueError(f"cache_ratio='auto' and max_memory's {entries.device} entry both size the expert "
                             "cache from the device: give one of them")
        if entries.device is not None and len(given) <= 1:
            given = given or ["max_memory"]
        if len(given) != 1:
            got = "neither" if not given else "both (" + ", ".join(
                f"{name}={getattr(self, name)!r}" for name in given) + ")"
            raise ValueError(
                "OffloadConfig needs exactly one budget: cache_size (expert slots per MoE layer, integer >= 1), "
                "cache_ratio (fraction of routed-expert bytes in (0, 1], or 'auto' to size it from free GPU memory) "
                f"or max_gpu_memory (device bytes for experts, e.g. '20GiB'), or accelerate's max_memory with a "
                f"device entry (the device's whole budget, e.g. {{0: '20GiB'}}); got {got}"
            )
        if self.cache_size is not None and (not _is_int(self.cache_size) or self.cache_size < 1):
            raise ValueError(
                f"cache_size={self.cache_size!r} is invalid: must be an integer >= 1 "
                "(expert slots per MoE layer)"
            )
        if self.cache_ratio is not None and self.cache_ratio != AUTO and (
            not _is_real(self.cache_ratio) or not 0.0 < float(self.cache_ratio) <= 1.0
        ):
            raise ValueError(
                f"cache_ratio={self.cache_ratio!r} is invalid: must be a number in (0, 1] "
                "(fraction of routed-expert bytes kept on the GPU) or 'auto' (sized from free GPU memory)"
            )
        if self.max_gpu_memory is not None:
            parse_memory(self.max_gpu_memory, "max_gpu_memory")

    @property
    def auto(self) -> bool:
        """Whether the budget is sized from the device at load (``cache_ratio="auto"``)."""
        return self.cache_ratio == AUTO

    def check_record_trace(self) -> None:
        """Refuse a ``record_trace`` path the recorder could not write as asked (``attach`` calls it).

        Checked against the file system at load, before any expert is read, not at construction:
        a config is a value that is copied (``dataclasses.replace``, replay) and round-trips through
        JSON after its trace was written, and the state that matters is the one when recording starts.
        """
        if self.record_trace is not None:
            from .recorder import check_trace_path

            check_trace_path(self.record_trace, overwrite=self.record_trace_overwrite,
                             field="record_trace", flag="record_trace_overwrite=True")

    def _check_choice(self, name: str, allowed: tuple[str, ...], label: str) -> None:
        value = getattr(self, name)
        if value not in allowed:
            raise ValueError(f"{name}={value!r} is unknown; {label}: {', '.join(allowed)}")

    def _check_unit(self, name: str, *, low_open: bool) -> None:
        value = getattr(self, name)
        ok = _is_real(value) and (0.0 < float(value) if low_open else 0.0 <= float(value)) and float(value) <= 1.0
        if not ok:
            interval = "(0, 1]" if low_open else "[0, 1]"
            raise ValueError(f"{name}={value!r} is invalid: must be a number in {interval}")

    # ------------------------------------------------------------------ model-dependent checks
    def resolve_slots(self, num_moe_layers: int, num_experts: int, *, expert_bytes: int | None = None) -> int:
        """Total GPU expert slots for a model with this many MoE layers and routed experts each.

        The budget is what was asked for, never more: ``cache_size`` slots per layer,
        ``cache_ratio`` of all experts rounded to whole slots (at most all of them), or the whole
        slots of ``expert_bytes`` that fit in ``max_gpu_memory`` (at most all experts). Raises
        ``ValueError`` when it cannot be met: more slots per layer than experts, or a budget that
        gives fewer than ``min_slots_per_layer`` slots to each layer (silently enlarging it would
        put more bytes on the device than the user allowed). ``cache_ratio="auto"`` asks the
        device: :meth:`resolve_device_slots`.
        """
        self._check_shape(num_moe_layers, num_experts)
        total_experts = num_moe_layers * num_experts
        if all(getattr(self, name) is None for name in BUDGETS):
            raise ValueError("max_memory's device entry becomes the expert budget when the model loads (it needs the "
                             "non-expert weights' size, OffloadConfig.attach); here give cache_size, cache_ratio or "
                             "max_gpu_memory")
        if self.auto:
            raise ValueError("cache_ratio='auto' is sized from the device when the model loads "
                             "(OffloadConfig.resolve_device_slots); here give cache_size or a numeric cache_ratio")
        if self.cache_size is not None:
            if self.cache_size > num_experts:
                raise ValueError(
                    f"cache_size={self.cache_size} exceeds num_experts={num_experts}: a MoE layer has only "
                    f"{num_experts} routed experts, so at most {num_experts} slots per layer are useful"
                )
            slots = int(self.cache_size) * num_moe_layers
        elif self.max_gpu_memory is not None:
            if expert_bytes is None:
                raise ValueError("max_gpu_memory needs the size of one expert to count slots (expert_bytes)")
            slots = slots_for_bytes(parse_memory(self.max_gpu_memory), expert_bytes, num_moe_layers, num_experts)
        else:
            slots = min(int(round(float(self.cache_ratio) * total_experts)), total_experts)
        self._check_minimum(slots, num_moe_layers, total_experts, expert_bytes)
        return slots

    def _check_shape(self, num_moe_layers: int, num_experts: int) -> None:
        if num_moe_layers < 1 or num_experts < 1:
            raise ValueError(
                f"model has num_moe_layers={num_moe_layers}, num_experts={num_experts}: nothing to offload"
            )
        if self.min_slots_per_layer > num_experts:
            raise ValueError(
                f"min_slots_per_layer={self.min_slots_per_layer} exceeds num_experts={num_experts} per layer"
            )

    def resolve_device_slots(self, model_config: Any, dtype_bytes: int, device: Any,
                             block_length: int | None = None) -> int:
        """Total slots for a model loaded on ``device`` (``attach`` calls it before any expert is read).

        ``cache_ratio="auto"``: from the device's free memory (``budget.auto_slots``; a CUDA device is
        needed). Any budget on a CUDA device: a pool larger than the free memory is refused here,
        with the sizes, rather than failing in the allocator.
        """
        import torch

        from . import budget

        layers, experts = int(model_config.num_moe_layers), int(model_config.num_experts)
        one = budget.expert_bytes(model_config.hidden_size, model_config.moe_intermediate_size, dtype_bytes)
        dev = torch.device(device)
        memory = None if self.device != "emulated" or self.emulated_memory is None else \
            parse_memory(self.emulated_memory, "emulated_memory")
        if memory is not None and memory < layers * self.min_slots_per_layer * one:
            raise ValueError(f"emulated_memory={self.emulated_memory!r} ({budget.format_bytes(memory)}) is below the "
                             f"per-layer minimum: {layers} MoE layers x min_slots_per_layer="
                             f"{self.min_slots_per_layer} x {budget.format_bytes(one)} per expert = "
                             f"{budget.format_bytes(layers * self.min_slots_per_layer * one)}")
        if self.auto and self.device == "emulated":
            if memory is None:
                raise ValueError("cache_ratio='auto' on device='emulated' sizes the pool from emulated_memory: give it")
            self._check_shape(layers, experts)
            return budget.auto_slots(
                free_bytes=memory, total_bytes=memory, reclaimable_bytes=0, activations=0,
                one_expert_bytes=one, num_layers=layers, num_experts=experts,
                min_slots_per_layer=self.min_slots_per_layer, gpu_memory_utilization=1.0, device="emulated")
        if self.auto:
            self._check_shape(layers, experts)
            free, total, reclaimable = budget.device_memory(dev)
            context = self.auto_context_length or int(model_config.max_position_embeddings)
            activations = budget.activation_bytes(model_config, self.auto_batch_size, context, dtype_bytes,
                                                  block_length or budget.DEFAULT_BLOCK_LENGTH)
            return budget.auto_slots(
                free_bytes=free, total_bytes=total, reclaimable_bytes=reclaimable, activations=activations,
                one_expert_bytes=one, num_layers=layers, num_experts=experts,
                min_slots_per_layer=self.min_slots_per_layer, gpu_memory_utilization=self.gpu_memory_utilization,
                device=str(dev))
        slots = self.resolve_slots(layers, experts, expert_bytes=one)
        if memory is not None and slots * one > memory:
            raise ValueError(f"{self.budget_text()} needs {budget.format_bytes(slots * one)} for {slots} expert "
                             f"slots, but emulated_memory={self.emulated_memory!r} is "
                             f"{budget.format_bytes(memory)}; use a smaller budget")
        if dev.type == "cuda" and torch.cuda.is_available():
            free, total, reclaimable = budget.device_memory(dev)
            if slots * one > free + reclaimable:
                raise ValueError(
                    f"{self.budget_text()} needs {budget.format_bytes(slots * one)} of device memory for "
                    f"{slots} expert slots, but {dev} has {budget.format_bytes(free + reclaimable)} free of "
                    f"{budget.format_bytes(total)}; use a smaller budget or cache_ratio='auto'"
                )
        return slots

    def budget_text(self) -> str:
        """``cache_size=4``: the budget as given, for messages."""
        name = next((name for name in BUDGETS if getattr(self, name) is not None), "max_memory")
        return f"{name}={getattr(self, name)!r}"

    def _check_minimum(self, slots: int, num_moe_layers: int, total_experts: int,
                       expert_bytes: int | None = None) -> None:
        """Raise unless ``slots`` gives every layer ``min_slots_per_layer``; the message says what would fit."""
        needed = num_moe_layers * self.min_slots_per_layer
        if slots >= needed:
            return
        if self.cache_size is not None:
            budget = f"cache_size={self.cache_size}"
            fix = f"cache_size >= {self.min_slots_per_layer}"
        elif self.max_gpu_memory is not None:
            budget = f"max_gpu_memory={self.max_gpu_memory!r} ({expert_bytes} bytes per expert slot)"
            fix = f"max_gpu_memory >= {needed * expert_bytes} (bytes)"
        else:
            budget = f"cache_ratio={self.cache_ratio!r}"
            fix = f"cache_ratio >= {needed / total_experts:.6g}"
        most = slots // num_moe_layers
        lower = (f" or min_slots_per_layer <= {most}" if most >= 1
                 else " (the budget does not give every layer even one slot)")
        raise ValueError(
            f"{budget} gives {slots} expert slots over {num_moe_layers} MoE layers, fewer than "
            f"min_slots_per_layer={self.min_slots_per_layer} x {num_moe_layers} layers = {needed} needed; "
            f"the budget is not enlarged: use {fix}{lower}"
        )

    # ------------------------------------------------------------------ serialisation
    def attach(self, model: Any, checkpoint_files: list[str], dtype: Any = None) -> Any:
        """Install the offload runtime on a model loaded without routed experts (from_pretrained calls this).

        The one place the config is resolved: ``runtime.attach_offload`` turns it into the slot budget
        (against the device), the :class:`System` (:meth:`resolved_system`) and the cost model, and
        hands those down; the runtime imports no config (the import runs this way only).
        """
        from .max_memory import resolve_max_memory
        from .runtime import attach_offload

        self.check_record_trace()  # before the store reads any expert
        return attach_offload(model, resolve_max_memory(self, model, dtype), checkpoint_files, dtype)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OffloadConfig:
        if not isinstance(data, dict):
            raise ValueError(f"OffloadConfig.from_dict expects a dict, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"unknown OffloadConfig field(s): {', '.join(unknown)}; known fields: {', '.join(sorted(known))}"
            )
        return cls(**data)

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_json(cls, text: str) -> OffloadConfig:
        return cls.from_dict(json.loads(text))
