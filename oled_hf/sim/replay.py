"""Replay a routing trace through a policy and cache size, without a model.

Replay drives :class:`~oled_hf.offload.controller.CacheController`, the object the live runtime
drives, over the trace's timeline (forward routing, iteration events, block starts and ends in
recorded order), so its counters equal the live run's at the same config.

Time is simulated on a :class:`~oled_hf.sim.timeline.Timeline` (copy engine, GPU, CPU, host),
carried across layers and forwards: per layer access the non-expert part, then the host planner
(measured wall time of the policy update + plan + prefetch decision, or a stated constant per
access), then the GPU experts in the order their weights are ready and the CPU experts
concurrently (one CPU batch per access; its read-bound part slowed where it overlaps the copy
engine, host DRAM being shared). A system's prefetcher (:class:`~oled_hf.offload.policies.prefetch.Prefetcher`)
copies layer l+1's predicted experts when layer l's plan is ready (optimistic for it: the hidden
state its prediction uses leaves layer l only at its end), on the same FIFO copy engine as demand
copies (a ``demand_first`` prefetcher's queued copies yield to demand copies).

The dispatcher decides with a *believed* cost model (``believed``; default the true one) and the
timeline charges the true one (``cost_model``): a mis-calibrated dispatcher is timed honestly.
With the dispatch knob ``calibrate=1`` (:mod:`oled_hf.offload.online_calibration`) the dispatcher
corrects its belief online: after each layer access it is given the true cost model's times for
what it did (per-expert copy time if it copied, the CPU batch's time alone if it ran one), each
times lognormal noise ``exp(measure_sigma * z)`` from a RNG seeded by ``measure_seed``, so a run
is reproducible. Systems whose dispatch copies every miss read no cost and are not calibrated.

Two full-residency references, no planner, no copies: ``full_time_s`` (fused/grouped MoE: one
launch per layer, each active expert's bytes once at HBM bandwidth, FLOPs at the stated efficiency;
``CostModel.fused_layer_time``), and ``loop_time_s`` (a per-expert loop: one launch per active
expert; ``CostModel.loop_layer_time``).

Speed (``eval/replay_speed.py``, LLaDA2.0-mini scale, one busy CPU core): ~0.13 ms per layer access
(256 routing entries, ~65 unique experts) with ``oled``: a million routing entries replay in ~1 s.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from oled_hf.offload.allocation import uniform_capacities
from oled_hf.offload.config import DEFAULT_POLICY, OffloadConfig
from oled_hf.offload.controller import CacheController, build_controller, idle_copy_budget
from oled_hf.offload.costmodel import CostModel
from oled_hf.offload.online_calibration import CALIBRATION_KNOBS, CalibrationSettings, settings_from_knobs
from oled_hf.offload.system import (
    System,
    parse_system,
    resolve_system,
    system_of_legacy,
)

from ..offload.trace import OP_BLOCK_END, OP_EVENT, OP_FORWARD, Trace
from .belady import belady_global, belady_min
from .timeline import HostTimeline, HostTiming, Timeline

_COUNTED = ("hits", "misses", "evictions", "copies", "bytes_copied", "cpu_expert_tokens", "gpu_expert_tokens",
            "dead_on_arrival", "accesses")


# host time of one shadow plan of ``adaptive`` over a whole access of ``oled``, as measured at LLaDA2.0-mini's
# shape (``eval/planner_speed.py --policies oled adaptive --only mini --mini-percent 25``: 118.7 us for
# three shadows against oled's 24.0 us per access, one thread): a stated planner time scales by it. Kept
# since the followed candidate stopped needing a shadow, though that run measured 1.39 (60.5 us for two
# against 21.8): it charges the shadows more than measured, not less
SHADOW_PLAN_SCALE = 1.65


@dataclass
class ReplayResult:
    policy: str
    cache_size: float  # slots per MoE layer (average)
    layer_adaptive: bool
    cpu_compute: str
    hits: int
    misses: int
    evictions: int
    copies: int
    bytes_copied: int
    cpu_expert_tokens: int
    gpu_expert_tokens: int
    dead_on_arrival: int
    layer_accesses: int
    routing_entries: int
    output_tokens: int
    sim_time_s: float
    full_time_s: float  # fused/grouped resident reference
    loop_time_s: float = 0.0  # per-expert-loop resident reference
    forwards: int = 0
    planner_time_s: float = 0.0  # host planner time on the simulated timeline
    shadow_time_s: float = 0.0  # ... of it, the retention part's deferred work (adaptive's shadows)
    compute_s: float = 0.0  # expert compute charged (GPU experts and CPU batches)
    blocking_waits: int = 0  # with host timing (one host thread): waves that waited for a copy
    exposed_copy_s: float = 0.0  # time layers waited for copies beyond their compute
    prefetch_issued: int = 0  # experts copied ahead by a prefetcher
    prefetch_used: int = 0  # ... hit at least once before eviction
    prefetch_wasted: int = 0  # ... evicted (or left at the end) unused
    expert_bytes: int = 0
    slot_accesses: int = 0  # sum over layer accesses of the layer's capacity (for U_slot)
    kernel: str = ""
    capacities: list[int] = field(default_factory=list)
    per_layer_hit_rate: list[float] = field(default_factory=list)
    bound_hit_rate: float | None = None  # Belady reference at the same budget (see format_table)
    bound_name: str = ""
    system: str = ""  # the parts that ran (retention+prefetch+dispatch+allocation)
    # with online calibration: the final belief over the starting one, per term (copy, cpu_fixed, cpu_token)
    calibration: dict[str, float] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float:
        return self.hits / (self.hits + self.misses) if self.hits + self.misses else 0.0

    @property
    def tpot_s(self) -> float:
        return self.sim_time_s / max(self.output_tokens, 1)

    @property
    def full_tpot_s(self) -> float:
        return self.full_time_s / max(self.output_tokens, 1)

    @property
    def ratio_to_full(self) -> float:
        """Simulated time over the fused-resident reference's."""
        return self.sim_time_s / self.full_time_s if self.full_time_s > 0 else float("nan")

    @property
    def ratio_to_loop(self) -> float:
        return self.sim_time_s / self.loop_time_s if self.loop_time_s > 0 else float("nan")

    @property
    def u_slot(self) -> float:
        """Slot utilization: hits per slot per layer access (mean fraction of the cache used)."""
        return self.hits / self.slot_accesses if self.slot_accesses else 0.0

    @property
    def u_byte(self) -> float:
        """Reuse factor: bytes served from the cache (hits x expert bytes) per H2D byte copied."""
        return self.hits / self.copies if self.copies else float("inf")

    @property
    def copies_used(self) -> float:
        """Fraction of copied experts hit again before eviction (1 - dead-on-arrival / evictions)."""
        return 1.0 - self.dead_on_arrival / self.evictions if self.evictions else 1.0

    @property
    def planner_per_forward_s(self) -> float:
        return self.planner_time_s / self.forwards if self.forwards else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.update(hit_rate=self.hit_rate, tpot_s=self.tpot_s, full_tpot_s=self.full_tpot_s,
                   ratio_to_full=self.ratio_to_full, ratio_to_loop=self.ratio_to_loop, u_slot=self.u_slot,
                   u_byte=self.u_byte, copies_used=self.copies_used,
                   planner_per_forward_s=self.planner_per_forward_s)
        return out


def default_cost_model(trace: Trace, kernel: str = "grouped") -> CostModel:
    """The H200 + PCIe 5 preset at the trace's own expert size (see ``oled_hf.sim.hardware`` for mini's)."""
    h = trace.header
    if not h.get("hidden_size") or not h.get("moe_intermediate_size"):
        raise ValueError("trace header lacks hidden_size/moe_intermediate_size: pass cost_model=")
    return CostModel.h200_pcie5(h["hidden_size"], h["moe_intermediate_size"], h.get("dtype_bytes", 2), kernel=kernel)


class _PrefetchBook:
    """Per (layer, expert): prefetched and not hit yet; counts used and wasted prefetches."""

    def __init__(self, num_layers: int, num_experts: int) -> None:
        self.pending = np.zeros((num_layers, num_experts), dtype=bool)
        self.issued = self.used = self.wasted = 0

    def hit(self, layer: int, hits: list[int]) -> None:
        if hits:
            p = self.pending[layer]
            n = int(np.count_nonzero(p[hits]))
            if n:
                self.used += n
                p[hits] = False

    def evicted(self, layer: int, expert: int | None) -> None:
        if expert is not None and expert >= 0 and self.pending[layer, expert]:
            self.pending[layer, expert] = False
            self.wasted += 1

    def finish(self) -> None:
        self.wasted += int(self.pending.sum())
        self.pending[:] = False


def _build(trace: Trace, config: OffloadConfig, system: System | None, cm: CostModel,
           believed: CostModel | None) -> CacheController:
    """The controller of one replay (it owns the system's prefetcher, ``CacheController.prefetch``).

    Without ``system`` the controller is built from ``config`` exactly as the live runtime builds
    it (its ``system``, or the legacy policy names; live == replay), with the prefetcher that
    system names (the legacy ``prefetch`` and ``moe-infinity`` have one).
    """
    L, E = trace.num_layers, trace.num_experts
    if system is None:
        return CacheController(config, L, E, cm, believed=believed)
    return build_controller(config, system, L, E, cm, believed)


def _moved(tl: Timeline, ready: np.ndarray) -> None:
    """Prefetches a demand copy overtook land later: their new landing times."""
    if tl.moved:
        for (ml, me), land in tl.moved.items():
            ready[ml, me] = land
        tl.moved.clear()


def _host_access(tl: HostTimeline, cm: CostModel, plan: Any, ready: np.ndarray, layer: int,
                 prefetch: Any) -> tuple[float, float]:
    """One planned layer access in the live executor's order on one host thread; (exposed wait, compute).

    After the plan: the first copy wave issued unless it refills the hits' slots, the prefetch
    decision and its copies, the CPU experts inline (the emulated device computes them on the host,
    after the copies it can issue), then each wave (``plan_waves``: hits, then copies) computed as one
    grouped call once its copies have landed, a later copy wave issued just before it, then the
    reuse copies.
    """
    from oled_hf.offload.executor import plan_waves  # the executor's own waves (it imports torch)

    counts = plan.counts
    compute = 0.0
    waves = plan_waves(plan)
    first = next((w for w in waves if w.copies), None)
    issued = None
    if first is not None and (waves[0].copies or not np.isin(first.slots, waves[0].slots).any()):
        ready[layer, first.experts] = tl.issue(first.experts.size)
        _moved(tl, ready)
        issued = first
    if prefetch is not None:
        prefetch()
    if plan.cpu:
        compute += cm.cpu_batch_time(counts[plan.cpu])
        tl.host(tl.host_free, compute)
    exposed = 0.0
    for wave in waves:
        if wave.copies and wave is not issued:
            ready[layer, wave.experts] = tl.issue(wave.experts.size)
            _moved(tl, ready)
        seconds = cm.gpu_layer_fixed_s + float(cm.gpu_times(counts[wave.experts]).sum())
        compute += seconds
        exposed += tl.compute(ready[layer, wave.experts], seconds)
    if plan.background:
        ready[layer, [c[0] for c in plan.background]] = tl.issue(len(plan.background))
        _moved(tl, ready)
    return exposed, compute


def split_calibration(system: System | None) -> tuple[System | None, CalibrationSettings | None]:
    """The system without its calibration knobs, and the calibration they ask for (None: off).

    The controller's dispatch part is built without them; replay attaches the calibrator itself
    (``Dispatcher.enable_calibration``), as it is replay that supplies the measurements.
    """
    if system is None:
        return None, None
    dk = system.part_knobs("dispatch")
    settings = settings_from_knobs(dk)
    if not any(k in CALIBRATION_KNOBS for k in dk):
        return system, None
    knobs = {k: v for k, v in system.knobs.items()
             if not (k.startswith("dispatch.") and k.split(".", 1)[1] in CALIBRATION_KNOBS)}
    return dataclasses.replace(system, knobs=knobs), settings


def budget_override(cache_size: int) -> dict[str, Any]:
    """Config changes that make ``cache_size`` (slots per MoE layer) the one budget of a replay.

    A recorded config may carry any of the three budgets; all others are cleared, so the replay's
    config holds exactly one (``OffloadConfig`` refuses two).
    """
    return {"cache_size": cache_size, "cache_ratio": None, "max_gpu_memory": None}


def replay(
    trace: Trace,
    policy_name: str,
    cache_size: int | None,
    *,
    layer_adaptive: bool = True,
    cpu_compute: str = "auto",
    cost_model: CostModel | None = None,
    offload_config: OffloadConfig | None = None,
    planner_s: float | None = None,
    warmup_sequences: int = 0,
    check_invariants: bool = False,
    system: System | str | None = None,
    believed: CostModel | None = None,
    measure_sigma: float = 0.1,
    measure_seed: int = 0,
    prefetch_budget: str = "timeline",
    host_timing: HostTiming | None = None,
    shadows_in_line: bool = False,
) -> ReplayResult:
    """Run the trace through a fresh controller. Explicit arguments override ``offload_config``.

    ``policy_name`` with ``layer_adaptive``/``cpu_compute``: a legacy policy name, built as the
    live runtime builds that config. ``system`` (a :class:`System` or a ``--system`` string): the
    composed system instead (``policy_name`` and ``layer_adaptive`` are then only labels and
    ignored; ``cpu_compute="off"`` makes its dispatch ``copy``, as the live runtime does on a CPU
    device). ``believed``: the cost model the dispatcher decides with (default the true one,
    ``cost_model``, which times the run).
    ``cache_size`` is slots per MoE layer (None: take the budget from ``offload_config``).
    ``planner_s``: host planner seconds per layer access; None measures the wall time of the
    policy update, plan, prefetch decision and event handling as they run here.
    ``warmup_sequences``: the first N recorded sequences warm the cache and the policy (as a server
    that has run earlier requests) and are left out of every counter and time; 0 = cold start.
    ``measure_sigma`` / ``measure_seed``: the noise of the measurements a calibrating dispatcher
    (dispatch knob ``calibrate=1``) is given (module docstring); unused without calibration.
    ``prefetch_budget``: how a capped prefetcher's budget is measured: ``"timeline"`` on this
    replay's copy engine, ``"planned"`` from the controller's cost model and the plan alone
    (``idle_copy_budget``), as a live ``generate`` decides, so that replay reproduces its decisions.
    ``host_timing``: time the run as the emulated device runs it (:class:`HostTimeline`: one host
    thread for the non-expert part, planning, compute and waits, the copy engine beside it, one
    grouped call per wave of experts as the live executor makes them); the decisions are the same.
    With it a capped prefetcher's budget is always ``"planned"``'s (the live executor's).
    ``shadows_in_line``: the retention part's deferred work (``adaptive``'s shadow caches) holds
    the next layer's start on the GPU (a host that cannot run it while the device computes);
    default: it runs on the host beside the device's work (the live executor runs it while the
    next layer's router output is on its way).
    """
    if prefetch_budget not in ("timeline", "planned"):
        raise ValueError(f"prefetch_budget={prefetch_budget!r} is invalid: must be 'timeline' or 'planned'")
    if not (isinstance(measure_sigma, (int, float)) and math.isfinite(measure_sigma) and 0 <= measure_sigma <= 2):
        raise ValueError(f"measure_sigma={measure_sigma!r} is invalid: must be a number in [0, 2] (log-space noise)")
    if isinstance(measure_seed, bool) or not isinstance(measure_seed, int) or measure_seed < 0:
        raise ValueError(f"measure_seed={measure_seed!r} is invalid: must be an integer >= 0")
    if cache_size is None and offload_config is None:
        raise ValueError("replay needs cache_size (slots per MoE layer) or an offload_config with a budget")
    sys_, calibration = split_calibration(parse_system(system) if isinstance(system, str) else system)
    if sys_ is not None and cpu_compute == "off":  # as the live runtime resolves a system on a CPU device
        sys_ = resolve_system(sys_, cpu_compute="off")
    base = offload_config if offload_config is not None else OffloadConfig(cache_size=cache_size)
    if sys_ is None:  # an old policy name and its flags: the system they name, resolved as a live config's is
        sys_ = resolve_system(None, policy=policy_name, cpu_compute=cpu_compute, layer_adaptive=layer_adaptive,
                              reuse_copies=base.oled_background_copies, reuse_min=base.oled_background_min_reuse)
    # the controller runs sys_ (build_controller); the config keeps the budget and the knobs, naming no system
    changes: dict[str, Any] = {"system": None, "policy": DEFAULT_POLICY, "layer_adaptive": True}
    if cache_size is not None:
        changes.update(budget_override(cache_size))
    config = dataclasses.replace(base, **changes)
    cm = cost_model if cost_model is not None else default_cost_model(trace).with_config(config)
    L, E = trace.num_layers, trace.num_experts
    ctrl = _build(trace, config, sys_, cm, believed)
    prefetcher = ctrl.prefetcher
    label = ctrl.system.parts
    dispatcher = ctrl.dispatcher
    calibrating = calibration is not None and dispatcher.cpu_enabled
    if calibrating:
        dispatcher.enable_calibration(calibration)
    rng = np.random.default_rng(measure_seed)

    def measured_s(true_s: float) -> float:
        return true_s * math.exp(measure_sigma * float(rng.standard_normal())) if measure_sigma else true_s
    if prefetcher is not None and prefetcher.uses_predicted_routes and not trace.has_predictions:
        raise ValueError(f"system {label!r} needs predicted routes for its {prefetcher.name!r} prefetcher: "
                         "record a version-2 trace (oled-moe trace record writes them)")
    measured = planner_s is None
    # a stated planner time is a planner like oled's; a retention part that costs more says by how much
    stated_plan_s = 0.0 if measured else float(planner_s) * ctrl.policy.host_cost_scale
    clock = time.perf_counter
    serial = host_timing is not None
    tl = HostTimeline(cm.copy_time(), demand_first=True, timing=host_timing) if serial else \
        Timeline(cm.copy_time(), demand_first=prefetcher is not None and prefetcher.demand_first)
    shared = cm.host_dram_bytes_per_s > 0 and cm.cpu_shared_fixed_s > cm.cpu_expert_fixed_s
    ready = np.zeros((L, E))  # when each resident expert's weights are on the device
    book = _PrefetchBook(L, E)
    full = loop = planner_total = exposed = compute = 0.0
    shadow_total = [0.0]
    slot_accesses = forwards = 0
    nonexpert = cm.nonexpert_s_per_layer
    fwd_seq = trace.arrays["fwd_seq"]
    seqs_seen: list[int] = []
    base: dict[str, Any] | None = None if warmup_sequences > 0 else {}
    committed = 0
    ev_off, ev_com = trace.arrays["ev_offsets"], trace.arrays["ev_committed"]
    pred_ids = None
    pf_last = [0.0]  # the host time of the last prefetch decision made inside a host-timed access

    def prefetch_step(l: int, plan: Any, lt: Any, plan_ready: float = 0.0, next_plan_s: float = 0.0) -> float:
        """The prefetch decision for layer l+1 and its copies; returns its host seconds.

        On the GPU timeline it runs on the host right after the plan (``plan_ready``); on the
        host timeline (``lt`` None) where the live executor makes it, after the first copy wave.
        ``next_plan_s``: the host time layer l+1's plan will take (the stated planner time, or this
        layer's measured one): its demand copies start only then, so it belongs to the window.
        """
        if prefetcher is None or l + 1 >= L:
            return 0.0
        t0 = clock()
        pc = None
        if pred_ids is not None:
            pr = pred_ids[l + 1]
            pc = np.bincount(pr[pr >= 0].reshape(-1).astype(np.int64), minlength=E)
        budget = None
        if prefetcher.capped and (prefetch_budget == "planned" or lt is None):  # as the live executor decides
            budget = idle_copy_budget(ctrl.believed, plan)
        elif prefetcher.capped:
            # predicted benefit: a prefetch pays only if its copy starts before layer l+1 plans
            # (where its demand copy would start); later ones would be overtaken anyway
            window = lt.end + nonexpert + next_plan_s - max(tl.copy_free, plan_ready)
            budget = max(math.ceil(window / cm.copy_time()), 0)
        pf = ctrl.prefetch(l + 1, budget, pc)
        pf_host = clock() - t0 if measured else 0.0
        if lt is None:
            pf_last[0] = pf_host
            tl.host(tl.host_free, pf_host)
        if pf:
            for _, _, ev in pf:
                book.evicted(l + 1, ev)
            keys = [(l + 1, c[0]) for c in pf]
            if lt is None:
                lands = tl.issue(len(pf), low=True, keys=keys)
            else:
                issue = tl.host(plan_ready, pf_host)  # decided on the host right after this plan
                lands = tl.copies(len(pf), issue, low=True, keys=keys)
            ready[l + 1, [c[0] for c in pf]] = lands
            book.pending[l + 1, [c[0] for c in pf]] = True
            book.issued += len(pf)
        elif pf_host and lt is not None:
            tl.host(plan_ready, pf_host)
        return pf_host

    def shadow_step(after: float | None) -> float:
        """The retention part's deferred work of this access (``adaptive``'s shadows); its host seconds.

        Charged on the host once the layer is issued (``after``: its plan and prefetch decision on
        the GPU timeline; None on the host timeline, in line): it delays the next layer only where
        it outlasts this layer's device work. A stated planner time charges ``SHADOW_PLAN_SCALE``
        times ``planner_s`` per shadow plan (``adaptive``), or the part's own ``deferred_cost_scale``
        (``learned``: its training step).
        """
        t0 = clock()
        n = ctrl.run_shadows()
        if not n:
            return 0.0
        scale = getattr(ctrl.policy, "deferred_cost_scale", SHADOW_PLAN_SCALE)  # per unit run_shadows counts
        sh = clock() - t0 if measured else n * scale * float(planner_s)
        shadow_total[0] += sh
        tl.host(tl.host_free if after is None else after, sh)
        if shadows_in_line and after is not None:
            tl.gpu_free = max(tl.gpu_free, tl.host_free)
        return sh

    for op, idx in trace.ops():
        if op == OP_FORWARD:
            seq = int(fwd_seq[idx])
            if not seqs_seen or seqs_seen[-1] != seq:
                seqs_seen.append(seq)
                if base is None and len(seqs_seen) > warmup_sequences:  # warm-up over: zero the books
                    book.pending[:] = False  # a warm-up prefetch hit later is neither issued nor used in the timed part
                    base = {"stats": {k: ctrl.stats.total(k) for k in _COUNTED}, "full": full, "loop": loop,
                            "planner": planner_total, "shadow": shadow_total[0],
                            "exposed": exposed, "slots": slot_accesses,
                            "compute": compute, "waits": tl.waits if serial else 0,
                            "forwards": forwards, "t0": max(tl.gpu_free, tl.host_free), "committed": committed,
                            "pf": (book.issued, book.used, book.wasted)}
            forwards += 1
            ctrl.begin_forward()
            ids, weights = trace.routing(idx)
            pred_ids = trace.predicted_routing(idx)[0] if prefetcher is not None and trace.has_predictions else None
            for l in range(L):
                t0 = clock()
                plan = ctrl.plan(l, ids[l], weights[l])
                host = clock() - t0
                counts = plan.counts
                book.hit(l, plan.hits)
                for _, _, ev in plan.copies:
                    book.evicted(l, ev)
                slot_accesses += ctrl.capacities[l]
                host = host if measured else stated_plan_s
                gpu_e = plan.hits + [c[0] for c in plan.copies]
                start, plan_ready = tl.begin_layer(nonexpert, host)
                if serial:
                    def prefetch_on_host(l=l, plan=plan) -> float:
                        return prefetch_step(l, plan, None)
                    if plan.background:
                        for _, _, ev in plan.background:
                            book.evicted(l, ev)
                    ex, cs = _host_access(tl, cm, plan, ready, l, prefetch_on_host if prefetcher is not None else None)
                    exposed += ex
                    compute += cs
                    planner_total += host + pf_last[0] + shadow_step(None)
                    pf_last[0] = 0.0
                    full += nonexpert + cm.fused_layer_time(counts)
                    loop += nonexpert + cm.loop_layer_time(counts)
                    continue
                if plan.copies:
                    ready[l, [c[0] for c in plan.copies]] = tl.copies(len(plan.copies), plan_ready)
                    if tl.moved:
                        for (ml, me), land in tl.moved.items():
                            ready[ml, me] = land
                        tl.moved.clear()
                if plan.background:  # behind the demand copies; the layer does not wait for them
                    for _, _, ev in plan.background:
                        book.evicted(l, ev)
                    ready[l, [c[0] for c in plan.background]] = tl.copies(len(plan.background), plan_ready)
                r = ready[l, gpu_e] if gpu_e else np.zeros(0)
                g = cm.gpu_times(counts[gpu_e]) if gpu_e else np.zeros(0)
                cpu = cm.cpu_batch_time(counts[plan.cpu]) if plan.cpu else 0.0
                cpu_sh = cm.cpu_batch_time(counts[plan.cpu], shared=True) if plan.cpu and shared else None
                lt = tl.end_layer(start, plan_ready, cm.gpu_layer_fixed_s, r, g, cpu, cpu_sh)
                if calibrating:
                    copied = bool(plan.copies or plan.background)
                    dispatcher.observe(measured_s(cm.copy_time()) if copied else None,
                                       counts[plan.cpu] if plan.cpu else None,
                                       measured_s(cpu) if plan.cpu else None)
                exposed += lt.exposed_copy_s
                compute += float(g.sum()) + (cm.gpu_layer_fixed_s if g.size else 0.0) + cpu
                # the prefetch decision for layer l+1 runs on the host right after this plan
                pf_host = prefetch_step(l, plan, lt, plan_ready, host)
                planner_total += host + pf_host + shadow_step(plan_ready)
                full += nonexpert + cm.fused_layer_time(counts)
                loop += nonexpert + cm.loop_layer_time(counts)
            if check_invariants:
                ctrl.state.check_invariants()
        else:
            if op == OP_EVENT:
                committed += int(ev_com[int(ev_off[idx]):int(ev_off[idx + 1])].sum())
            t0 = clock()
            trace.deliver(ctrl, op, idx)
            host = clock() - t0 if measured else 0.0
            if op == OP_BLOCK_END:  # the controller's on_block_end already published a calibrating belief
                for move in ctrl.last_moves:
                    book.evicted(move.layer, move.evicted_expert)
                if check_invariants:
                    ctrl.state.check_invariants()
            if host:
                planner_total += host
                tl.host(tl.gpu_free, host)
    book.finish()
    if base is None:
        raise ValueError(f"warmup_sequences={warmup_sequences} leaves nothing to time: the trace has "
                         f"{len(seqs_seen)} sequence(s)")
    st = ctrl.stats
    b0 = base.get("stats", {})

    def total(name: str) -> int:
        return st.total(name) - b0.get(name, 0)

    pf0 = base.get("pf", (0, 0, 0))
    return ReplayResult(
        policy=policy_name, cache_size=ctrl.total_slots / L, layer_adaptive=ctrl.allocator is not None,
        cpu_compute=ctrl.dispatcher.cpu_compute, hits=total("hits"), misses=total("misses"),
        evictions=total("evictions"), copies=total("copies"), bytes_copied=total("bytes_copied"),
        cpu_expert_tokens=total("cpu_expert_tokens"), gpu_expert_tokens=total("gpu_expert_tokens"),
        dead_on_arrival=total("dead_on_arrival"), layer_accesses=total("accesses"),
        routing_entries=trace.routing_entries, output_tokens=committed - base.get("committed", 0),
        sim_time_s=max(tl.gpu_free, tl.host_free) - base.get("t0", 0.0), full_time_s=full - base.get("full", 0.0),
        loop_time_s=loop - base.get("loop", 0.0), forwards=forwards - base.get("forwards", 0),
        planner_time_s=planner_total - base.get("planner", 0.0),
        shadow_time_s=shadow_total[0] - base.get("shadow", 0.0), exposed_copy_s=exposed - base.get("exposed", 0.0),
        compute_s=compute - base.get("compute", 0.0),
        blocking_waits=(tl.waits - base.get("waits", 0)) if serial else 0,
        prefetch_issued=book.issued - pf0[0], prefetch_used=book.used - pf0[1],
        prefetch_wasted=book.wasted - pf0[2], expert_bytes=cm.expert_bytes,
        slot_accesses=slot_accesses - base.get("slots", 0), kernel=cm.kernel, capacities=list(ctrl.capacities),
        per_layer_hit_rate=st.layer_hit_rates(), system=label,
        calibration=dispatcher.calibrator.scales if dispatcher.calibrator is not None else {},
    )


def hit_bound(trace: Trace, size: int, layer_adaptive: bool, copy_only: bool):
    """The Belady MIN a run at ``size`` slots per layer is measured against (its hit-rate ceiling).

    Layer-adaptive runs: the global-budget MIN with bypass (per-layer MIN does not bound them).
    Uniform runs: per-layer MIN at the same capacities, with bypass where the dispatch may leave a
    miss on the CPU, demand MIN (``bypass=False``) where it copies every miss (``cpu_compute="off"``,
    dispatch ``copy``): such a run must admit every miss, so MIN+bypass is not reachable by it and
    would understate its share of the reachable ceiling. Demand/bypass caching only: a prefetcher's
    hits can exceed either.
    """
    total = size * trace.num_layers
    if layer_adaptive:
        return belady_global(trace, total)
    return belady_min(trace, uniform_capacities(total, trace.num_layers, trace.num_experts), bypass=not copy_only)


def compare(
    trace: Trace,
    policies: list[str],
    cache_sizes: list[int],
    *,
    layer_adaptive: bool = True,
    cpu_compute: str = "auto",
    cost_model: CostModel | None = None,
    planner_s: float | None = None,
    warmup_sequences: int = 0,
    bounds: bool = True,
    believed: CostModel | None = None,
) -> list[ReplayResult]:
    """Replay every (policy, cache size) and attach the matching Belady bound (:func:`hit_bound`).

    Policies that need predicted routes are skipped on version-1 traces.
    """
    results = []
    for size in cache_sizes:
        bound = hit_bound(trace, size, layer_adaptive, cpu_compute == "off") if bounds else None
        for name in policies:
            if system_of_legacy(name).prefetch == "gate" and not trace.has_predictions:
                continue
            r = replay(trace, name, size, layer_adaptive=layer_adaptive, cpu_compute=cpu_compute,
                       cost_model=cost_model, planner_s=planner_s, warmup_sequences=warmup_sequences,
                       believed=believed)
            if bound is not None:
                r.bound_hit_rate, r.bound_name = bound.hit_rate, bound.name
            results.append(r)
    return results


def compare_systems(
    trace: Trace,
    systems: list[str],
    cache_sizes: list[int],
    *,
    cost_model: CostModel | None = None,
    planner_s: float | None = None,
    warmup_sequences: int = 0,
    believed: CostModel | None = None,
    bounds: bool = True,
) -> list[ReplayResult]:
    """:func:`compare` for composed systems (``--system`` strings); each row is labelled by its name."""
    parsed = [(name, parse_system(name)) for name in systems]
    results = []
    for size in cache_sizes:
        cache: dict[tuple[bool, bool], Any] = {}
        for name, system in parsed:
            if system.prefetch in ("gate", "gate-capped") and not trace.has_predictions:
                continue
            r = replay(trace, name, size, system=system, cost_model=cost_model, planner_s=planner_s,
                       warmup_sequences=warmup_sequences, believed=believed)
            if bounds:
                key = (system.layer_adaptive, system.dispatch == "copy")
                if key not in cache:
                    cache[key] = hit_bound(trace, size, *key)
                r.bound_hit_rate, r.bound_name = cache[key].hit_rate, cache[key].name
            results.append(r)
    return results


MIN_NOTES = {
    "MIN": "demand MIN (per layer, every miss admitted): the ceiling of uniform runs that copy every miss",
    "MIN+bypass": "per-layer MIN with bypass (a miss may stay uncached): the ceiling of uniform runs with CPU compute",
    "global MIN+bypass": "MIN with bypass over one budget for all layers: the ceiling of layer-adaptive runs",
}


def min_footnote(names: list[str], column: str) -> str:
    """One line per MIN variant used: what ``column`` divides by in the rows that name it."""
    lines = [f"{column}: hit rate / the Belady MIN named in the row's MIN column, at the same budget "
             "(demand/bypass caching only: prefetchers may exceed it)"]
    lines += [f"  {n}: {MIN_NOTES.get(n, n)}" for n in names]
    return "\n".join(lines)


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def format_table(results: list[ReplayResult]) -> str:
    """Plain-text table: policy, capacity, hit rate, % of Belady, bytes, prefetch, TPOT, ratios."""
    head = ["policy", "slots/layer", "adaptive", "cpu", "hit rate", "hit/MIN %", "MIN", "U_slot", "bytes copied",
            "pf used/wasted", "exposed ms", "plan ms/fwd", "CPU exp-tok", "TPOT ms", "x fused", "x loop"]
    rows = [head]
    for r in results:
        pct = f"{100 * r.hit_rate / r.bound_hit_rate:.1f}" if r.bound_hit_rate else "-"
        pf = f"{r.prefetch_used}/{r.prefetch_wasted}" if r.prefetch_issued else "-"
        rows.append([r.policy, f"{r.cache_size:g}", "yes" if r.layer_adaptive else "no", r.cpu_compute,
                     f"{r.hit_rate:.3f}", pct, r.bound_name or "-", f"{r.u_slot:.3f}", _bytes(r.bytes_copied), pf,
                     f"{1e3 * r.exposed_copy_s:.2f}", f"{1e3 * r.planner_per_forward_s:.3f}",
                     str(r.cpu_expert_tokens), f"{1e3 * r.tpot_s:.3f}", f"{r.ratio_to_full:.2f}",
                     f"{r.ratio_to_loop:.2f}"])
    if results:
        r = results[0]
        n = max(r.output_tokens, 1)
        blank = ["all", "-", "-", "1.000", "-", "-", "-", "0 B", "-", "0.00", "0.000", "0"]
        rows.append(["full (fused MoE)", *blank, f"{1e3 * r.full_tpot_s:.3f}", "1.00",
                     f"{r.full_time_s / r.loop_time_s:.2f}"])
        rows.append(["full (per-expert loop)", *blank, f"{1e3 * r.loop_time_s / n:.3f}",
                     f"{r.loop_time_s / r.full_time_s:.2f}", "1.00"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    names = sorted({r.bound_name for r in results if r.bound_name})
    if names:
        lines.append(min_footnote(names, "hit/MIN %"))
    if results:
        lines.append(f"x fused: TPOT / full residency as a fused MoE (one launch per layer); GPU expert kernel "
                     f"of the offloaded runs: {results[0].kernel}")
    return "\n".join(lines)
