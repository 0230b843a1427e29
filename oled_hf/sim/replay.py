"""Replay a routing trace through a policy and cache size, without a model.

Replay drives :class:`~oled_hf.offload.controller.CacheController`, the object the live runtime
drives, over the trace's timeline (forward routing, iteration events, block starts and ends in
recorded order), so its counters equal the live run's at the same config. Time is simulated with
the cost model: per layer access ``max(CPU time, GPU path)`` where the GPU path computes hits while
copies stream in (see ``CostModel.gpu_path_time``), plus the non-expert time per layer; full
residency is the same trace with every expert a hit.

Speed (``eval/replay_speed.py``, LLaDA2.0-mini scale, one busy CPU core): ~0.13 ms per layer access
(256 routing entries, ~65 unique experts), i.e. ~1.9M routing entries/s or ~0.5M unique
(forward, layer, expert) accesses/s with ``oled``: a million of either unit replays in 0.5-2 s.
Everything per access is vectorised with NumPy; Python loops run only over copies.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from oled_hf.offload.allocation import uniform_capacities
from oled_hf.offload.config import OffloadConfig
from oled_hf.offload.controller import CacheController
from oled_hf.offload.costmodel import CostModel

from .belady import belady_global, belady_min
from .trace import OP_BLOCK_END, OP_FORWARD, Trace


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
    full_time_s: float
    capacities: list[int] = field(default_factory=list)
    per_layer_hit_rate: list[float] = field(default_factory=list)
    bound_hit_rate: float | None = None  # Belady reference at the same budget (see format_table)
    bound_name: str = ""

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
        return self.sim_time_s / self.full_time_s if self.full_time_s > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.update(hit_rate=self.hit_rate, tpot_s=self.tpot_s, full_tpot_s=self.full_tpot_s,
                   ratio_to_full=self.ratio_to_full)
        return out


def default_cost_model(trace: Trace) -> CostModel:
    h = trace.header
    if not h.get("hidden_size") or not h.get("moe_intermediate_size"):
        raise ValueError("trace header lacks hidden_size/moe_intermediate_size: pass cost_model=")
    return CostModel.h200_pcie5(h["hidden_size"], h["moe_intermediate_size"], h.get("dtype_bytes", 2))


def replay(
    trace: Trace,
    policy_name: str,
    cache_size: int | None,
    *,
    layer_adaptive: bool = True,
    cpu_compute: str = "auto",
    cost_model: CostModel | None = None,
    offload_config: OffloadConfig | None = None,
    check_invariants: bool = False,
) -> ReplayResult:
    """Run the trace through a fresh controller. Explicit arguments override ``offload_config``.

    ``cache_size`` is slots per MoE layer (None: take the budget from ``offload_config``).
    """
    if cache_size is None and offload_config is None:
        raise ValueError("replay needs cache_size (slots per MoE layer) or an offload_config with a budget")
    base = offload_config if offload_config is not None else OffloadConfig(cache_size=cache_size)
    changes: dict[str, Any] = {"policy": policy_name, "layer_adaptive": layer_adaptive, "cpu_compute": cpu_compute}
    if cache_size is not None:
        changes.update(cache_size=cache_size, cache_ratio=None)
    config = dataclasses.replace(base, **changes)
    cm = cost_model if cost_model is not None else default_cost_model(trace).with_config(config)
    L, E = trace.num_layers, trace.num_experts
    ctrl = CacheController(config, L, E, cm)
    sim = full = 0.0
    copy_t = cm.copy_time()
    for op, idx in trace.ops():
        if op == OP_FORWARD:
            ctrl.begin_forward()
            ids, weights = trace.routing(idx)
            for l in range(L):
                plan = ctrl.plan(l, ids[l], weights[l])
                counts = plan.counts
                gpu = cm.gpu_times(counts)
                g_hits = float(gpu[plan.hits].sum())
                if plan.copies:
                    g = gpu[[c[0] for c in plan.copies]]
                    suffix = np.cumsum(g[::-1])[::-1]
                    lands = copy_t * np.arange(1, g.size + 1)
                    g_path = max(g_hits + float(suffix[0]), float((lands + suffix).max()))
                else:
                    g_path = g_hits
                cpu = float(cm.cpu_times(counts[plan.cpu]).sum()) if plan.cpu else 0.0
                sim += max(cpu, g_path) + cm.nonexpert_s_per_layer
                full += float(gpu.sum()) + cm.nonexpert_s_per_layer
            if check_invariants:
                ctrl.state.check_invariants()
        else:
            trace.deliver(ctrl, op, idx)
            if op == OP_BLOCK_END and check_invariants:
                ctrl.state.check_invariants()
    st = ctrl.stats
    return ReplayResult(
        policy=policy_name, cache_size=ctrl.total_slots / L, layer_adaptive=layer_adaptive,
        cpu_compute=cpu_compute, hits=st.total("hits"), misses=st.total("misses"),
        evictions=st.total("evictions"), copies=st.total("copies"), bytes_copied=st.total("bytes_copied"),
        cpu_expert_tokens=st.total("cpu_expert_tokens"), gpu_expert_tokens=st.total("gpu_expert_tokens"),
        dead_on_arrival=st.total("dead_on_arrival"), layer_accesses=st.total("accesses"),
        routing_entries=trace.routing_entries, output_tokens=trace.output_tokens(),
        sim_time_s=sim, full_time_s=full, capacities=list(ctrl.capacities),
        per_layer_hit_rate=st.layer_hit_rates(),
    )


def compare(
    trace: Trace,
    policies: list[str],
    cache_sizes: list[int],
    *,
    layer_adaptive: bool = True,
    cpu_compute: str = "auto",
    cost_model: CostModel | None = None,
    bounds: bool = True,
) -> list[ReplayResult]:
    """Replay every (policy, cache size) and attach the matching Belady bound.

    Uniform runs get per-layer MIN with bypass at the same per-layer capacities; layer-adaptive
    runs get the global-budget MIN with bypass (per-layer MIN does not bound them).
    """
    results = []
    for size in cache_sizes:
        bound = None
        if bounds:
            total = size * trace.num_layers
            if layer_adaptive:
                bound = belady_global(trace, total)
            else:
                bound = belady_min(trace, uniform_capacities(total, trace.num_layers, trace.num_experts))
        for name in policies:
            r = replay(trace, name, size, layer_adaptive=layer_adaptive, cpu_compute=cpu_compute, cost_model=cost_model)
            if bound is not None:
                r.bound_hit_rate, r.bound_name = bound.hit_rate, bound.name
            results.append(r)
    return results


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def format_table(results: list[ReplayResult]) -> str:
    """Plain-text table: policy, capacity, hit rate, % of Belady, bytes, CPU expert-tokens, TPOT."""
    head = ["policy", "slots/layer", "adaptive", "cpu", "hit rate", "% of MIN", "bytes copied",
            "CPU exp-tok", "TPOT ms", "x full"]
    rows = [head]
    for r in results:
        pct = f"{100 * r.hit_rate / r.bound_hit_rate:.1f}" if r.bound_hit_rate else "-"
        rows.append([r.policy, f"{r.cache_size:g}", "yes" if r.layer_adaptive else "no", r.cpu_compute,
                     f"{r.hit_rate:.3f}", pct, _bytes(r.bytes_copied), str(r.cpu_expert_tokens),
                     f"{1e3 * r.tpot_s:.3f}", f"{r.ratio_to_full:.2f}"])
    if results:
        r = results[0]
        rows.append(["full", "all", "-", "-", "1.000", "-", "0 B", "0", f"{1e3 * r.full_tpot_s:.3f}", "1.00"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    names = sorted({r.bound_name for r in results if r.bound_name})
    if names:
        lines.append(f"% of MIN: hit rate / {', '.join(names)} hit rate at the same budget")
    return "\n".join(lines)
