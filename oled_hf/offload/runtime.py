"""OffloadRuntime: wires store, cache, controller and executors into a loaded model.

``attach_offload(model, config, checkpoint_files)`` is called by the model's ``from_pretrained``
(through ``OffloadConfig.attach``) when an ``offload_config`` was passed. It resolves the config
once: the slot budget (against the device, before any expert is read), the cost model (calibrated,
then the config's overrides) and the system (``OffloadConfig.resolved_system`` with the CPU-compute
mode the device allows) are handed to the controller as values; the controller reads only its
knobs (allocation damping and floor, retention knobs) from the config object. This module imports
no config (the config imports it, in ``attach``), nor does anything it builds.

The model was built without routed-expert modules, so its non-expert weights loaded the normal
Transformers way; here the experts go from the safetensors files into the ExpertStore, the device
slot pool is allocated once, and every MoE block gets an offloaded executor. The runtime listens
to the decoder's iteration events and forwards them to the controller (policy, allocator) and,
when asked, to a trace recorder. A layer that holds every expert runs without waiting for its
routing on the host; the controller plans that access later,
in order, before anything reads its state (``CacheController.defer``).

Threads: one offloaded model runs one call at a time. Its runtime holds a re-entrant lock
(:attr:`OffloadRuntime.lock`) for the whole of each ``model.generate(...)`` and each direct
``model(...)`` forward, so calls from several threads on one model are serialised: each waits for
the running one to finish, then gets exactly the tokens it would get alone. A lock per forward
would not do: the policy's state (``on_block_start`` ... ``on_iteration`` ... ``on_block_end``)
and the deferred plans span the forwards of one ``generate``, so two interleaved generates would
corrupt it (slots recorded as holding one expert while they hold another). The lock is taken by
thin wrappers the runtime installs on the model instance (``model.generate``, ``model.forward``;
the class's methods are untouched, ``modeling/`` knows nothing of it). ``stats()`` never waits:
while another thread runs the model it returns the figures as of that model's last finished
``generate`` (``"snapshot": True``); ``reset_stats()`` waits its turn. For parallel requests load
one model per thread (each gets its own slot pool), or queue them as ``oled-moe serve`` does.

Placement: the dtype and device are fixed at load. ``model._apply`` (what ``.to``, ``.half``,
``.float``, ``.cuda`` call) is wrapped on the instance too (:class:`_FixedPlacement`): a call that
would change them raises, naming how to load the model instead; one that changes nothing runs.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..modeling.events import IterationObserver
from .cache import ExpertCache
from .calibration import calibrate
from .controller import CacheController
from .costmodel import CostModel
from .cpu_experts import make_cpu_pool
from .dispatch import resolve_cpu_compute
from .executor import OffloadedExpertsExecutor
from .store import ExpertStore

# host seconds per layer: planning (and prefetch decisions), issuing copies, expert compute on the
# cache's device (copy waits excluded; "gpu" for short, reported as ``device_seconds``), CPU experts,
# waiting for the CPU pool's result, blocking on copies in flight (the emulated device; ~0 on CUDA),
# the retention part's deferred work once the layer is issued (``adaptive``'s shadow caches)
TIMERS = ("policy", "copy", "gpu", "cpu", "cpu_wait", "copy_wait", "shadow")


def timer_key(name: str) -> str:
    """The stats key of a timer: the device's expert compute is ``device_seconds`` (and ``gpu_seconds`` on CUDA only:
    on a CPU or emulated device it is the CPU's time, which a ``gpu_`` name would misreport)."""
    return f"{'device' if name == 'gpu' else name}_seconds"


class _Serialised:
    """A model method that runs under the runtime's lock (installed on the instance, see the module doc).

    A small class rather than a closure: it names what it wraps (``__wrapped__``, the signature
    Transformers inspects), and ``copy.deepcopy`` of the model fails on its lock instead of
    silently keeping a function that runs the original model.
    """

    def __init__(self, lock: threading.RLock, method, after: Callable[[], None] | None = None) -> None:
        self.lock, self.method, self.after = lock, method, after
        functools.update_wrapper(self, method)

    def __call__(self, *args, **kwargs):
        with self.lock:
            result = self.method(*args, **kwargs)
            if self.after is not None:  # still under the lock: what ran is complete
                self.after()
            return result


class _FixedPlacement:
    """``model._apply`` of an offloaded model: refuses ``.to``/``.half``/``.float``/``.cuda`` that would move it.

    ``nn.Module.to``, ``half``, ``float``, ``cuda``, ``cpu`` all go through ``_apply(fn)``, which
    converts parameters and buffers only: the routed experts live outside the modules (the
    ExpertStore on the host and the device slot pool), so a converted model would multiply
    float16 hidden states with float32 expert slots (``expected m1 and m2 to have the same
    dtype``) or read slots on a device it left. Converting the store would copy every expert
    (and defeat the zero-copy mmap store), so the dtype and device are fixed at load and a call
    that would change them raises before anything is converted; the model keeps working as it
    was. A call that changes nothing (``model.to(model.device)``, as ``pipeline()`` does) runs.

    What ``fn`` would do is probed on an empty tensor of each (dtype, device) the model holds.
    A device change of any tensor is refused, and a dtype change of the experts' dtype; other
    dtypes (a float32 router bias beside bfloat16 weights) convert as they would resident.
    """

    def __init__(self, method, model, store_dtype: torch.dtype, device: torch.device) -> None:
        self.method, self.model, self.store_dtype, self.device = method, model, store_dtype, device

    def __call__(self, fn, *args, **kwargs):
        tensors = [*self.model.parameters(), *self.model.buffers()]
        for dtype, device in sorted({(t.dtype, t.device) for t in tensors}, key=str):
            out = fn(torch.empty(0, dtype=dtype, device=device))
            if not isinstance(out, torch.Tensor):
                continue
            recast = dtype == self.store_dtype and out.dtype != dtype
            if out.device != device or recast:
                wanted = out.dtype if recast else self.store_dtype
                hint = ("the meta device holds no weights to run: keep the model as loaded"
                        if out.device.type == "meta" else
                        f"load it as you want it instead: from_pretrained(path, dtype={wanted}, "
                        f"device_map={str(out.device)!r}, offload_config=...)")
                raise ValueError(
                    f"an offloaded model's dtype and device are fixed at load: this call would turn its "
                    f"{dtype} weights on {device} into {out.dtype} on {out.device}, but its routed experts "
                    f"(the expert store, {self.store_dtype}, and the slot pool on {self.device}) are not "
                    f"modules and do not follow; the model is unchanged; {hint}"
                )
        return self.method(fn, *args, **kwargs)


class OffloadRuntime(IterationObserver):
    """The offload machinery of one loaded model; one call at a time (``lock``, see the module doc)."""

    def __init__(self, model, config: Any, store: ExpertStore, device: torch.device,
                 total_slots: int | None = None, emulated: Any = None):
        """``config``: the model's ``OffloadConfig`` (not imported: it imports this module in ``attach``),
        resolved here once into the slots, the cost model and the system the controller is handed."""
        cfg = model.config
        self.config = config
        # Held for a whole generate and for each direct forward: re-entrant, since generate's
        # forwards take it again on the same thread.
        self.lock = threading.RLock()
        self.store = store
        self.num_layers, self.num_experts = cfg.num_moe_layers, cfg.num_experts
        # total_slots: from attach_offload, which sized it against the device before reading experts
        self.total_slots = total_slots if total_slots is not None else config.resolve_slots(
            self.num_layers, self.num_experts, expert_bytes=store.expert_bytes)
        # ``emulated``: the emulated device attach_offload built (and checked) before reading the store
        if emulated is None:
            emulated = config.emulated_device(store.expert_bytes)
        self.cache = ExpertCache(store, self.total_slots, device, emulated)
        self.cost_model = self._cost_model(cfg)
        # "auto" decided by the device: off where the experts' device is the CPU (resolve_cpu_compute)
        self.cpu_compute = resolve_cpu_compute(config.cpu_compute, accelerator=self.cache.cuda)
        self.controller = CacheController(config, self.num_layers, self.num_experts, self.cost_model,
                                          total_slots=self.total_slots,
                                          system=config.resolved_system(cpu_compute=self.cpu_compute))
        # CPU misses run in a worker thread beside the device work; on a CPU-only machine inline
        # (the "device" is the same cores), unless a test turns the overlap path on.
        self.overlap_cpu = self.cache.cuda
        self._cpu_pool = None
        self.profile = False
        self.timing = {name: np.zeros(self.num_layers) for name in TIMERS}
        self.controller.plan_timer = self._charge_policy
        # A layer holding every expert runs without waiting for its routing on the host; it is
        # planned afterwards (the same plans: see controller.py). False plans every access at once.
        self.defer_routing = True
        # routing copies to the host that a forward waited for, per layer (on the CPU a view,
        # counted alike): one per planned access, none for an all-hits access
        self.routing_transfers = np.zeros(self.num_layers, dtype=np.int64)
        self.prefetches = np.zeros(self.num_layers, dtype=np.int64)  # prefetch copies issued into each layer
        self.forwards = 0
        self.executors = [OffloadedExpertsExecutor(self, i) for i in range(self.num_layers)]
        for block, executor in zip(model.moe_blocks(), self.executors):
            block.experts_executor = executor
        model.model.register_forward_pre_hook(self._begin_forward)
        model.add_iteration_observer(self)
        self.recorder = None
        if config.record_trace:
            from .recorder import TraceRecorder

            self.recorder = TraceRecorder(model, config.record_trace, cost_model=self.cost_model,
                                          overwrite=config.record_trace_overwrite)
        self._take_snapshot()  # what another thread's stats() sees until the first generate ends
        model.generate = _Serialised(self.lock, model.generate, after=self._take_snapshot)
        model.forward = _Serialised(self.lock, model.forward)
        model._apply = _FixedPlacement(model._apply, model, store.dtype, self.cache.device)

    def _take_snapshot(self) -> None:
        """Keep the current figures for other threads' ``stats()`` (called under the lock)."""
        self._snapshot = self._stats()

    def cpu_pool(self):
        if self._cpu_pool is None:
            self._cpu_pool = make_cpu_pool()
        return self._cpu_pool

    # ---- cost model ---------------------------------------------------------------------
    def _cost_model(self, cfg) -> CostModel:
        dtype_bytes = torch.empty((), dtype=self.store.dtype).element_size()
        preset = CostModel.h200_pcie5(cfg.hidden_size, cfg.moe_intermediate_size, dtype_bytes)
        if self.config.calibrate:
            preset = calibrate(self.store, self.cache, preset)
        link = getattr(self.cache.backend, "copy_seconds", None)
        if link is not None:  # the emulated device: its link is known, not measured (the device's compute is)
            one = self.store.expert_bytes
            preset = dataclasses.replace(preset, h2d_bytes_per_s=one / link(one))
        return preset.with_config(self.config)

    def _charge_policy(self, layer: int, seconds: float) -> None:
        """The host time of a deferred plan, charged to its layer's policy timer."""
        self.timing["policy"][layer] += seconds

    def recover(self) -> None:
        """After a failed access: residency back to what the slots hold; every slot map rebuilt."""
        self.controller.recover(self.cache.slot_tags)
        self._forget_slot_maps()

    def _forget_slot_maps(self) -> None:
        for executor in self.executors:
            executor.slot_map = None

    # ---- observer hooks (deferred accesses are planned first, timed per layer) -------------
    def _begin_forward(self, module, args):
        self.forwards += 1
        self.controller.begin_forward()

    def on_block_start(self, block_index, token_ids):
        self.controller.on_block_start(block_index, token_ids)

    def on_iteration(self, event):
        self.controller.flush()
        t = time.perf_counter()
        self.controller.on_iteration(event)
        self.timing["policy"][0] += time.perf_counter() - t

    def on_block_end(self, block_index, token_ids):
        self.controller.flush()
        t = time.perf_counter()
        self.controller.on_block_end(block_index, token_ids)
        if self.controller.last_moves:  # slots changed hands: no layer's slot map can be trusted
            self._forget_slot_maps()
        self.timing["policy"][0] += time.perf_counter() - t

    def on_generate_end(self):
        self.controller.flush()  # the last forward's deferred plans: generate returns with final counters

    # ---- stats ---------------------------------------------------------------------------
    def stats(self) -> dict:
        """Per-layer and total figures; never waits for another thread's call (see the module doc).

        ``"snapshot"`` is False when the figures are current, True when another thread was running
        the model, so they are those at the end of its last finished ``generate``: reading the live
        counters then would plan that thread's deferred accesses under its feet.
        """
        if not self.lock.acquire(blocking=False):
            return {**copy.deepcopy(self._snapshot), "snapshot": True}
        try:
            self._take_snapshot()
            return {**copy.deepcopy(self._snapshot), "snapshot": False}
        finally:
            self.lock.release()

    def _stats(self) -> dict:
        st = self.controller.stats  # (reading them plans any deferred access first)
        per_layer = []
        for layer in range(self.num_layers):
            hits, misses = int(st.hits[layer]), int(st.misses[layer])
            per_layer.append({
                "layer": layer, "capacity": int(self.controller.capacities[layer]), "hits": hits, "misses": misses,
                "hit_rate": hits / (hits + misses) if hits + misses else 0.0,
                "evictions": int(st.evictions[layer]), "bytes_copied": int(st.bytes_copied[layer]),
                "cpu_expert_tokens": int(st.cpu_expert_tokens[layer]),
                "host_syncs": int(self.cache.backend.syncs.get(layer, 0)),
                **{timer_key(name): float(self.timing[name][layer]) for name in TIMERS},
            })
            if self.cache.cuda:
                per_layer[-1]["gpu_seconds"] = per_layer[-1]["device_seconds"]
        total = {key: sum(row[key] for row in per_layer) for key in per_layer[0] if key not in ("layer", "hit_rate")}
        lookups = total["hits"] + total["misses"]
        total["hit_rate"] = total["hits"] / lookups if lookups else 0.0
        total["forwards"] = self.forwards
        # blocking host waits for the device (routing reads, CPU-expert inputs, staging buffers): the
        # layers' plus those outside any layer's call; per MoE layer access, as the issue budget reads them
        total["host_syncs"] = int(sum(self.cache.backend.syncs.values()))
        accesses = int(sum(st.accesses))
        total["host_syncs_per_access"] = total["host_syncs"] / accesses if accesses else 0.0
        system = self.controller.system
        return {
            "policy": system.retention, "system": system.parts if system.prefetch != "none" else
            "+".join((system.retention, system.dispatch, system.allocation)),
            "prefetches": int(self.prefetches.sum()),
            "total_slots": self.total_slots,
            "slots_per_layer": self.total_slots / self.num_layers, "device": self._device_name(),
            "pool_bytes": self.cache.pool_bytes, "host_bytes": self.store.host_bytes(), "store": self.store.mode,
            "cpu_compute": self.cpu_compute, "cpu_compute_requested": self.config.cpu_compute,
            "cost_model": dict(vars(self.cost_model)), "total": total, "layers": per_layer,
            # online calibration (calibrate_online): the belief's scales over the starting one, per term
            "calibration": cal.scales if (cal := self.controller.dispatcher.calibrator) is not None else {},
        }

    def _device_name(self) -> str:
        return "emulated" if self.cache.backend.name == "emulated" else str(self.cache.device)

    def reset_stats(self) -> None:
        """Zero every counter; waits for a call running on another thread to finish first."""
        with self.lock:
            self.controller.stats.reset()  # (deferred accesses are planned before the reset)
            for name in TIMERS:
                self.timing[name][:] = 0
            self.routing_transfers[:] = 0
            self.prefetches[:] = 0
            self.forwards = 0
            backend = self.cache.backend
            backend.syncs.clear()
            if hasattr(backend, "reset_counters"):  # the emulated device's wait counters
                backend.reset_counters()
            self._take_snapshot()


def attach_offload(model, config: Any, checkpoint_files: list[str], dtype: torch.dtype | None):
    """Build the store from the checkpoint shards and install the runtime on ``model``."""
    cfg = model.config
    layer_ids = [block.layer_idx for block in model.moe_blocks()]
    weight_dtype = dtype or next(model.parameters()).dtype
    dtype_bytes = torch.empty((), dtype=weight_dtype).element_size()
    block_length = getattr(getattr(model, "generation_config", None), "block_length", None)
    # the budget first: a refused one (cache_ratio="auto" without CUDA, a pool larger than the free
    # device memory) is reported before the store reads any expert
    total_slots = config.resolve_device_slots(cfg, dtype_bytes, model.device, block_length)
    # a cache on the CPU device lives in host memory beside the store
    expert_bytes = 3 * cfg.hidden_size * cfg.moe_intermediate_size * dtype_bytes
    cache_host_bytes = total_slots * expert_bytes if torch.device(model.device).type == "cpu" else 0
    if config.device == "emulated" and model.device.type != "cpu":
        raise ValueError(f"device='emulated' runs the model on the CPU; it was loaded on {model.device}: "
                         "load it with device_map='cpu'")
    emulated = config.emulated_device(expert_bytes)  # its link is refused here, before any expert is read
    if emulated is not None:
        try:
            emulated.check_copy_time(expert_bytes)
        except ValueError:
            emulated.close()
            raise
    store = ExpertStore.from_safetensors([str(f) for f in checkpoint_files], layer_ids, cfg.num_experts,
                                         cfg.hidden_size, cfg.moe_intermediate_size, weight_dtype, config.store,
                                         extra_bytes=cache_host_bytes)
    return OffloadRuntime(model, config, store, model.device, total_slots, emulated)
