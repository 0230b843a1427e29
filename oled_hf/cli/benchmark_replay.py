"""``oled-moe benchmark --device emulated``: each offloaded row's live TPOT beside its replay's.

On the emulated device (``oled_hf.offload.device``) copies take real wall-clock time on a copy
worker, so a live run is timed the way a GPU run would be, and the project's replay can be held to
it: each offloaded model records its routing trace while it runs; after the timed passes the trace
is replayed (``oled_hf.sim.replay``) with

* the decisions of the live run: the same system, the same budget, the live cost model as the
  belief and the prefetch budget as the live executor measures it (``prefetch_budget="planned"``),
  so the replay makes the very plans and prefetches the run made (``tests/sim/test_live_replay.py``);
* the timing of this machine and this device: copies at the emulated link's bandwidth and latency,
  expert compute as measured at load (``calibration.py``), the planner's host time as measured in
  the replay, and the non-expert part of each layer (attention, router, shared expert) as the
  run's wall time outside the offloaded executors, per layer forward.

``replay_tpot_s`` is the replay's simulated time of the timed passes over the run's new tokens; the
decomposition gives where the two differ (the executors' measured copy wait, compute and planning
beside the replay's exposed copy time, compute and planner time).
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Any


def replay_measured(c: Any, trace_path: Path, warmup_sequences: int) -> dict[str, Any]:
    """``measured_tpot_s``, ``replay_tpot_s`` and their decomposition for one offloaded row ``c`` (``Measured``)."""
    from ..offload.runtime import TIMERS
    from ..offload.trace import load_trace
    from ..sim.replay import replay

    rt = c.model._offload_runtime
    stats = c.model.offload_stats()
    forwards = max(int(stats["total"]["forwards"]), 1)
    layer_forwards = forwards * rt.num_layers
    executor_s = {name: float(rt.timing[name].sum()) for name in TIMERS}
    nonexpert = max(c.seconds - sum(executor_s.values()), 0.0) / layer_forwards
    timing = dataclasses.replace(rt.cost_model, nonexpert_s_per_layer=nonexpert)
    result = replay(load_trace(str(trace_path)), c.name, None, offload_config=rt.config,
                    system=rt.controller.system, cost_model=timing, believed=rt.cost_model,
                    prefetch_budget="planned", warmup_sequences=warmup_sequences)
    tokens = max(c.tokens, 1)
    measured = statistics.median(c.tpot)
    sim = result.sim_time_s / tokens
    per_token = {f"live_{k}_s": v / tokens for k, v in executor_s.items()}
    return {
        "measured_tpot_s": c.seconds / tokens, "measured_tpot_median_s": measured, "replay_tpot_s": sim,
        "replay_over_measured": sim * tokens / c.seconds if c.seconds else None,
        "decomposition": {
            "nonexpert_s": nonexpert * layer_forwards / tokens, **per_token,
            "replay_planner_s": result.planner_time_s / tokens, "replay_exposed_copy_s": result.exposed_copy_s / tokens,
            "replay_hits": result.hits, "live_hits": stats["total"]["hits"],
            "replay_prefetches": result.prefetch_issued, "live_prefetches": stats["prefetches"],
            "link_seconds_per_copy": rt.cost_model.copy_time(),
        },
    }
