"""Replay throughput: how fast a routing trace replays through each policy, and planner overhead.

Prints, per policy, routing entries/s ((layer, token, k) triples), unique expert accesses/s (one
per (forward, layer, expert), the unit hits are counted in) and microseconds per layer access,
both for the full replay (planning + simulated timing) and for the planner path alone (what the
live runtime pays per MoE layer: ``CacheController.plan``). Uses a recorded trace if given, else a
synthetic one at LLaDA2.0-mini scale (19 MoE layers, 256 experts, top-8, block 32).

    python eval/replay_speed.py [--trace run.pt] [--cache-size 40] [--blocks 12]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from oled_hf.offload.config import OffloadConfig
from oled_hf.offload.controller import CacheController
from oled_hf.offload.costmodel import CostModel
from oled_hf.offload.system import spelling, system_of_legacy
from oled_hf.offload.trace import OP_FORWARD, Trace, load_trace
from oled_hf.sim.belady import request_sets
from oled_hf.sim.replay import default_cost_model, replay
from oled_hf.sim.synthetic import synthetic_trace

POLICIES = ("oled", "lru", "lfu", "static", "tide")


def planner_only(trace: Trace, policy: str, cache_size: int, cost_model: CostModel) -> float:
    """Seconds spent in CacheController.plan over the trace (events and rebalancing excluded)."""
    config = OffloadConfig(cache_size=cache_size, system=spelling(system_of_legacy(policy)))
    ctrl = CacheController(config, trace.num_layers, trace.num_experts, cost_model)
    spent = 0.0
    for op, idx in trace.ops():
        if op == OP_FORWARD:
            ctrl.begin_forward()
            ids, weights = trace.routing(idx)
            t0 = time.perf_counter()
            for layer in range(trace.num_layers):
                ctrl.plan(layer, ids[layer], weights[layer])
            spent += time.perf_counter() - t0
        else:
            trace.deliver(ctrl, op, idx)
    return spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", help="a recorded trace (default: synthetic LLaDA2.0-mini-scale)")
    ap.add_argument("--cache-size", type=int, default=40, help="expert slots per MoE layer")
    ap.add_argument("--blocks", type=int, default=12, help="synthetic blocks (about 90k entries each)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.trace:
        trace = load_trace(args.trace)
    else:
        trace = synthetic_trace(num_layers=19, num_experts=256, top_k=8, block_length=32, num_blocks=args.blocks,
                                hidden_size=2048, moe_intermediate_size=512, seed=0)
    print(f"trace: {trace.num_forwards} forwards, {trace.num_layers} MoE layers, "
          f"{trace.routing_entries:,} routing entries ({time.perf_counter() - t0:.1f} s to build/load)")
    unique = int(request_sets(trace).sum())
    accesses = trace.num_forwards * trace.num_layers
    print(f"{accesses:,} layer accesses, {unique:,} unique expert accesses "
          f"({unique / accesses:.1f} per layer access); cache {args.cache_size} slots/layer")
    cm = default_cost_model(trace)
    print(f"{'policy':8} {'replay s':>9} {'entries/s':>12} {'unique/s':>11} {'us/access':>10} "
          f"{'planner us/access':>18} {'hit rate':>9}")
    for policy in POLICIES:
        t0 = time.perf_counter()
        result = replay(trace, policy, args.cache_size, cost_model=cm)
        wall = time.perf_counter() - t0
        plan_s = planner_only(trace, policy, args.cache_size, cm)
        print(f"{policy:8} {wall:9.2f} {trace.routing_entries / wall:12,.0f} {unique / wall:11,.0f} "
              f"{1e6 * wall / accesses:10.1f} {1e6 * plan_s / accesses:18.1f} {result.hit_rate:9.3f}")
    print(f"(numpy {np.__version__}; one CPU core; wall-clock includes simulated timing and rebalancing)")


if __name__ == "__main__":
    main()
