"""``oled-moe benchmark --device emulated``: each offloaded row's live TPOT beside its replay's.

On the emulated device (``oled_hf.offload.device``) copies take real wall-clock time on a copy
worker, so a live run is timed the way a GPU run would be, and the project's replay can be held to
it: each offloaded model records its routing trace while it runs; after the timed passes the trace
is replayed (``oled_hf.sim.replay``) with

* the decisions of the live run: the same system, the same budget, the live cost model as the
  belief and the prefetch budget as the live executor measures it (``prefetch_budget="planned"``),
  so the replay makes the very plans and prefetches the run made (``tests/sim/test_live_replay.py``);
* the timing of this machine and this device: copies at the emulated link's bandwidth and latency,
  expert compute as measured at load (``calibration.py``), the planner's host time as the run
  measured it (its policy timer per layer access), and the non-expert part of each layer
  (attention, router, shared expert) as the run's wall time outside the offloaded executors, per
  layer forward.

``replay_tpot_s`` is the replay's simulated time of the timed passes over the run's new tokens; the
decomposition gives where the two differ (the executors' measured copy wait, compute and planning
beside the replay's exposed copy time, compute and planner time).
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Any


def scaled_compute(cm: Any, scale: float) -> Any:
    """``cm`` with every expert-compute term (device and CPU) times ``scale``; copies untouched."""
    names = ("gpu_expert_fixed_s", "gpu_s_per_token", "gpu_layer_fixed_s", "cpu_expert_fixed_s", "cpu_s_per_token",
             "cpu_overhead_s")
    return dataclasses.replace(cm, **{n: getattr(cm, n) * scale for n in names})


def replay_measured(c: Any, trace_path: Path, warmup_sequences: int) -> dict[str, Any]:
    """``measured_tpot_s``, ``replay_tpot_s`` and their decomposition for one offloaded row ``c`` (``Measured``)."""
    from ..offload.runtime import TIMERS
    from ..offload.trace import load_trace
    from ..sim.replay import replay
    from ..sim.timeline import HostTiming

    rt = c.model._offload_runtime
    device = rt.cache.backend
    stats = c.model.offload_stats()
    forwards = max(int(stats["total"]["forwards"]), 1)
    layer_forwards = forwards * rt.num_layers
    executor_s = {name: float(rt.timing[name].sum()) for name in TIMERS}
    nonexpert = max(c.seconds - sum(executor_s.values()), 0.0) / layer_forwards
    copies = stats["total"]["bytes_copied"] // max(rt.store.expert_bytes, 1) + stats["prefetches"]
    host = HostTiming(issue_s=executor_s["copy"] / max(copies, 1), wake_s=float(getattr(device, "wake_s", 0.0)))
    trace = load_trace(str(trace_path))

    def run(cm: Any, planner_s: float | None = None) -> Any:
        return replay(trace, c.name, None, offload_config=rt.config, system=rt.controller.system, cost_model=cm,
                      believed=rt.cost_model, prefetch_budget="planned", warmup_sequences=warmup_sequences,
                      host_timing=host, planner_s=planner_s)

    timing = dataclasses.replace(rt.cost_model, nonexpert_s_per_layer=nonexpert)
    at_load = run(timing)
    # the expert compute as this run measured it (the executors' host time, copy waits excluded) over
    # what the load-time calibration predicts for the same accesses: the replay's compute is scaled by
    # it, so the replay is left to predict what it models, the copy waits and their order
    live_compute = executor_s["gpu"] + executor_s["cpu"]
    scale = live_compute / at_load.compute_s if at_load.compute_s > 0 else 1.0
    # planning as this run measured it (plan, prefetch decision, events: the policy timer per layer
    # access): timed in the replay's own loop it came out 2-3x faster than in the run, where it shares
    # the CPU and its caches with the model and the copy worker
    result = run(scaled_compute(timing, scale), planner_s=executor_s["policy"] / layer_forwards)
    tokens = max(c.tokens, 1)
    sim = result.sim_time_s / tokens
    per_token = {f"live_{k}_s": v / tokens for k, v in executor_s.items()}
    return {
        "measured_tpot_s": c.seconds / tokens, "measured_tpot_median_s": statistics.median(c.tpot),
        "replay_tpot_s": sim, "replay_over_measured": sim * tokens / c.seconds if c.seconds else None,
        "replay_tpot_compute_at_load_s": at_load.sim_time_s / tokens, "tokens": c.tokens,
        "decomposition": {
            "nonexpert_s": nonexpert * layer_forwards / tokens, **per_token,
            "replay_planner_s": result.planner_time_s / tokens, "replay_compute_s": result.compute_s / tokens,
            "replay_exposed_copy_s": result.exposed_copy_s / tokens,
            "replay_issue_s": host.issue_s * (result.copies + result.prefetch_issued) / tokens,
            "compute_in_run_over_at_load": scale,
            "replay_blocking_waits": result.blocking_waits, "live_blocking_waits": getattr(device, "blocking_waits", 0),
            "wake_s_per_wait": host.wake_s,
            "replay_hits": result.hits, "live_hits": stats["total"]["hits"],
            "replay_copies": result.copies, "live_copies": copies - stats["prefetches"],
            "replay_prefetches": result.prefetch_issued, "live_prefetches": stats["prefetches"],
            "link_seconds_per_copy": rt.cost_model.copy_time(),
        },
    }
