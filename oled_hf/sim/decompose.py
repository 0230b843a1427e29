"""Where the headline system's time above the valid bound goes: a telescoping decomposition.

The system is re-run step by step, each step removing one cause on top of the previous steps,
everything else unchanged; each share is the time the step removes, so the shares sum exactly to
``system - bound`` (the order is fixed and stated: shares of a telescoping sum depend on it). Every
run decides with the original cost model (``replay(believed=...)``), so a step that re-costs does
not also change the decisions it re-costs:

1. ``planner``: the host planner's time per access (the report charges a stated constant); the
   same system replayed with a zero planner. The bound plans nothing.
2. ``CPU batch overhead``: the true cost model's ``cpu_overhead_s`` (activations to the host and
   back, thread-pool wake-up, once per access with CPU experts) set to 0. The bound charges it too,
   once per access with CPU experts, so this share can exceed what the bound leaves to remove:
   the rest then comes out lower (read it as the overhead's part of the system's time).
3. ``discovery at the router``: the routing known ahead: demand copies issued at the layer's start
   instead of after its non-expert part (the router); the experts still run after it (they need
   its activations). A :class:`~oled_hf.sim.timeline.Timeline` subclass, put in replay's place
   for that run only.
4. ``layer-adaptive allocation vs uniform``: the system's allocation part swapped (adaptive ->
   uniform, or uniform -> adaptive); negative where the system's own allocation is the better.
5. ``retention (misses vs an offline schedule)``: the retention replaced by Belady's oracle
   (``belady``: it knows the whole future), its dispatch, prefetch and allocation kept.
6. ``remaining: oracle run -> bound``: the rest: what the oracle run still loses to the best
   offline schedule (the dispatcher's copy/CPU split and admission among them: *not* separated
   here, no oracle split exists to swap in), the bracket's width, and the relaxation's own gap.

Each step is a replay on the same timeline with the true cost model (``sim/replay.py``).
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from unittest import mock

import numpy as np

from oled_hf.offload.costmodel import CostModel
from oled_hf.offload.system import System

from ..offload.trace import Trace
from .belady import request_sets
from .replay import replay
from .timeline import LayerTiming, Timeline

# the module (the package re-exports its ``replay`` function under the same name)
replay_module = importlib.import_module("oled_hf.sim.replay")
STEPS = ("planner", "CPU batch overhead", "discovery at the router", "layer-adaptive allocation vs uniform",
         "retention (misses vs an offline schedule)", "remaining: oracle run -> bound")


class KnownAheadTimeline(Timeline):
    """Replay's timeline with the routing known at the layer's start: its copies are issued then.

    The GPU and CPU experts still start after the non-expert part (``begin_layer``'s plan, taken
    at the layer's start, is only when copies may be issued).
    """

    _compute_from: float = 0.0

    def begin_layer(self, nonexpert_s: float, planner_s: float) -> tuple[float, float]:
        start = self.gpu_free
        self._compute_from = start + nonexpert_s
        return start, self.host(start, planner_s)

    def end_layer(self, start: float, plan_ready: float, gpu_fixed_s: float, ready: np.ndarray, gpu_s: np.ndarray,
                  cpu_s: float, cpu_shared_s: float | None = None) -> LayerTiming:
        return super().end_layer(start, max(plan_ready, self._compute_from), gpu_fixed_s, ready, gpu_s, cpu_s,
                                 cpu_shared_s)


@dataclass
class Decomposition:
    """Seconds: the system's time, the bound's, and each step's share (summing to the difference)."""

    system_s: float
    bound_s: float
    shares: list[tuple[str, float]]

    def table(self, full_s: float) -> list[list[str]]:
        """Rows: step, ms, share of the gap, x fused it accounts for."""
        gap = self.system_s - self.bound_s
        rows = [["system", f"{1e3 * self.system_s:.2f}", "-", f"{self.system_s / full_s:.2f}"]]
        for name, s in self.shares:
            rows.append([name, f"{1e3 * s:.2f}", f"{s / gap:.0%}" if gap > 0 else "-", f"{s / full_s:.2f}"])
        rows.append(["valid bound", f"{1e3 * self.bound_s:.2f}", "-", f"{self.bound_s / full_s:.2f}"])
        return rows


def decompose(trace: Trace, system: System, size: int, cm: CostModel, planner_s: float, bound_s: float,
              warmup_sequences: int = 1) -> Decomposition:
    """The shares of ``system``'s time above ``bound_s`` at ``size`` slots per layer (module docstring)."""
    def run(s: System, planner: float, true_cm: CostModel = cm, ahead: bool = False) -> float:
        def go() -> float:
            return replay(trace, "step", size, system=s, cost_model=true_cm, believed=cm, planner_s=planner,
                          warmup_sequences=warmup_sequences).sim_time_s
        if not ahead:
            return go()
        with mock.patch.object(replay_module, "Timeline", KnownAheadTimeline):
            return go()

    no_overhead = dataclasses.replace(cm, cpu_overhead_s=0.0)
    swapped = dataclasses.replace(system, allocation="uniform" if system.allocation == "adaptive" else "adaptive")
    knobs = {k: v for k, v in swapped.knobs.items() if not k.startswith("retention.")}
    oracle = dataclasses.replace(swapped, retention="belady", knobs=knobs).with_knobs(
        retention__future=list(request_sets(trace)))
    times = [run(system, planner_s), run(system, 0.0), run(system, 0.0, no_overhead),
             run(system, 0.0, no_overhead, True), run(swapped, 0.0, no_overhead, True),
             run(oracle, 0.0, no_overhead, True)]
    shares = [(name, a - b) for name, a, b in zip(STEPS, times, times[1:])]
    shares.append((STEPS[-1], times[-1] - bound_s))
    assert np.isclose(sum(s for _, s in shares), times[0] - bound_s)
    return Decomposition(times[0], bound_s, shares)
