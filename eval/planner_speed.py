"""Per-call cost of the offload controller's hot path: ``plan``, ``on_iteration``, ``on_block_end``.

The live executor calls ``CacheController.plan`` once per MoE layer per forward with torch routing
tensors (``topk_ids`` int64 and ``topk_weights`` fp32, ``[T, k]``); the decoder calls
``on_iteration`` once per denoising forward and ``on_block_start``/``on_block_end`` once per block.
This script replays routing with realistic locality through a fresh controller per run, times every
call, and prints microseconds per call (median over ``--runs`` runs of the per-run mean) per policy
and ``cpu_compute`` mode, plus ``total``: all controller time per plan call (events and block ends
amortised over the plan calls), for two shapes:

* ``small``: the ``small`` preset (7 MoE layers, 64 experts, top-8, 32-token blocks) at 26 slots per
  layer (~40 %). Uses a trace recorded from that checkpoint if ``--trace`` is given, else a synthetic
  one of the same shape. Budget: ~65 us per plan call (2 % of a ~23 ms resident forward).
* ``mini``: LLaDA2.0-mini's shape (19 MoE layers, 256 experts, top-8, blocks of 32) at 10, 40 and
  100 % of the experts cached (26, 102, 256 slots per layer), synthetic routing. Budget: 50 us
  per layer access for oled at 40 % (under 1 ms per 19-layer forward, against ~3.2 ms for a
  fused-resident forward on an H200); each mini row also prints ms per forward.

A digest of all plans, rebalances and stats per configuration is printed with ``--digest`` (to check
that an optimisation changed no decision). A trace of the small checkpoint is recorded with::

    oled-moe make-tiny /tmp/small --preset small
    oled-moe trace record --model /tmp/small --prompts prompts.txt --out /tmp/small.trace \
        --block-length 32 --max-new-tokens 64

Measure on a quiet core (single-threaded; configurations are interleaved, medians reported)::

    python eval/planner_speed.py [--trace /tmp/small.trace] [--runs 5] [--digest]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch

from oled_hf.offload.config import OffloadConfig
from oled_hf.offload.controller import CacheController
from oled_hf.offload.costmodel import CostModel
from oled_hf.offload.system import spelling, system_of_legacy
from oled_hf.offload.trace import OP_BLOCK_END, OP_BLOCK_START, OP_EVENT, OP_FORWARD, Trace, load_trace
from oled_hf.sim.synthetic import synthetic_trace

POLICIES = ("oled", "lru", "lfu", "static", "tide", "adaptive", "learned")
# not legacy policy names: the systems their rows time (adaptive: candidates shadowed per access;
# learned: its predictor's update, training and ranking, OLED's update included)
COMPOSED = {"adaptive": "adaptive+cpu+reuse+adaptive", "learned": "learned+cpu+reuse+adaptive"}
KINDS = ("plan", "shadow", "on_iteration", "on_block_start", "on_block_end")
BUDGET_US = 65.0  # small preset: 2 % of a ~23 ms resident forward, over its 7 MoE layers
MINI_BUDGET_US = 50.0  # mini at 40 %: under 1 ms per 19-layer forward (a fused-resident H200 forward ~3.2 ms)


@dataclass
class Workload:
    """A trace pre-converted to what the live runtime passes: per forward, per layer torch tensors."""

    name: str
    trace: Trace
    cache_size: int
    ops: list[tuple[int, object]]  # (op, payload): routing list, event, or marker, built once

    @classmethod
    def build(cls, name: str, trace: Trace, cache_size: int) -> Workload:
        ops: list[tuple[int, object]] = []
        for op, idx in trace.ops():
            if op == OP_FORWARD:
                ids, weights = trace.routing(idx)
                layers = [
                    (torch.from_numpy(np.ascontiguousarray(ids[l], dtype=np.int64)),
                     torch.from_numpy(np.ascontiguousarray(weights[l], dtype=np.float32)))
                    for l in range(trace.num_layers)
                ]
                ops.append((op, layers))
            elif op == OP_EVENT:
                ops.append((op, trace.event(idx)))
            else:
                ops.append((op, trace.marker(idx)))
        return cls(name, trace, cache_size, ops)


def run_once(work: Workload, policy: str, cpu_compute: str, digest: bool = False) -> tuple[dict[str, float], str]:
    """One replay through a fresh controller: (mean seconds per call of each kind, plan digest)."""
    tr = work.trace
    hdr = tr.header
    cm = CostModel.h200_pcie5(hdr.get("hidden_size", 512), hdr.get("moe_intermediate_size", 128),
                              hdr.get("dtype_bytes", 2))
    system = COMPOSED.get(policy) or spelling(system_of_legacy(policy))
    ctrl = CacheController(OffloadConfig(cache_size=work.cache_size, system=system,
                                         cpu_compute=cpu_compute),
                           tr.num_layers, tr.num_experts, cm)
    spent = dict.fromkeys(KINDS, 0.0)
    calls = dict.fromkeys(KINDS, 0)
    h = hashlib.sha256() if digest else None
    clock = time.perf_counter
    for op, payload in work.ops:
        if op == OP_FORWARD:
            ctrl.begin_forward()
            for layer, (ids, weights) in enumerate(payload):
                t0 = clock()
                p = ctrl.plan(layer, ids, weights)
                t1 = clock()
                spent["plan"] += t1 - t0
                ctrl.run_shadows()  # adaptive's deferred half, off the critical path (0 for the others)
                spent["shadow"] += clock() - t1
                if h is not None:
                    h.update(repr((p.layer, p.hits, p.copies, p.cpu, sorted(p.slot_of.items()),
                                   np.asarray(p.counts).tolist())).encode())
            calls["plan"] += len(payload)
            calls["shadow"] += len(payload)
            continue
        if op == OP_EVENT:
            kind, fn, args = "on_iteration", ctrl.on_iteration, (payload,)
        elif op == OP_BLOCK_START:
            kind, fn, args = "on_block_start", ctrl.on_block_start, payload
        elif op == OP_BLOCK_END:
            kind, fn, args = "on_block_end", ctrl.on_block_end, payload
        else:
            continue
        t0 = clock()
        fn(*args)
        spent[kind] += clock() - t0
        calls[kind] += 1
        if h is not None and op == OP_BLOCK_END:
            h.update(repr((list(ctrl.capacities), [tuple(m) for m in ctrl.last_moves])).encode())
    if h is not None:
        h.update(repr(ctrl.stats.to_dict(per_layer=True)).encode())
    per_call = {k: spent[k] / calls[k] if calls[k] else float("nan") for k in KINDS}
    per_call["total"] = sum(spent.values()) / calls["plan"]  # everything, spread over the plan calls
    return per_call, (h.hexdigest()[:16] if h is not None else "")


def measure(work: Workload, configs: list[tuple[str, str]], runs: int, digest: bool) -> dict:
    """Per configuration: (median over ``runs`` of the per-run mean us per call, digest).

    Runs are interleaved round-robin over the configurations (after one warm-up run each), so a
    burst of load on a shared machine is spread over all of them rather than skewing one.
    """
    digests = {cfg: run_once(work, *cfg, digest)[1] for cfg in configs}
    samples: dict[tuple[str, str], list[dict[str, float]]] = {cfg: [] for cfg in configs}
    for _ in range(runs):
        for cfg in configs:
            samples[cfg].append(run_once(work, *cfg)[0])
    out = {}
    for cfg in configs:
        us = {k: 1e6 * statistics.median(s[k] for s in samples[cfg]) for k in samples[cfg][0]}
        totals = [1e6 * s["total"] for s in samples[cfg]]
        us["spread"] = max(totals) - min(totals)  # of the per-run totals, max - min
        out[cfg] = (us, digests[cfg])
    return out


def workloads(trace_path: str | None, blocks: int, mini_percents=(10, 40, 100)) -> list[Workload]:
    if trace_path:
        small = load_trace(trace_path)
        small_name = f"small (recorded {trace_path})"
    else:
        small = synthetic_trace(num_layers=7, num_experts=64, top_k=8, block_length=32, num_blocks=blocks,
                                num_sequences=2, prompt_length=32, hidden_size=512, moe_intermediate_size=128,
                                popularity_scale=1.0, seed=0)
        small_name = "small (synthetic)"
    mini = synthetic_trace(num_layers=19, num_experts=256, top_k=8, block_length=32, num_blocks=max(2, blocks // 2),
                           prompt_length=32, hidden_size=2048, moe_intermediate_size=512, seed=0)
    minis = [Workload.build(f"mini (synthetic, {p}% cached)", mini, max(1, round(256 * p / 100)))
             for p in mini_percents]
    return [Workload.build(small_name, small, 26), *minis]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", help="a trace recorded from the small checkpoint (default: synthetic)")
    ap.add_argument("--runs", type=int, default=5, help="timed runs per configuration (median reported)")
    ap.add_argument("--blocks", type=int, default=6, help="synthetic blocks per sequence")
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    ap.add_argument("--only", choices=("small", "mini"), help="measure one shape only")
    ap.add_argument("--digest", action="store_true", help="print a digest of every configuration's plans")
    ap.add_argument("--mini-percent", type=float, nargs="+", default=[10, 40, 100],
                    help="mini cache sizes, %% of the 256 experts per layer")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for work in workloads(args.trace, args.blocks, args.mini_percent):
        if args.only and not work.name.startswith(args.only):
            continue
        tr = work.trace
        print(f"\n{work.name}: {tr.num_layers} MoE layers x {tr.num_experts} experts, {tr.num_forwards} forwards, "
              f"cache {work.cache_size}/layer; us per call, median of {args.runs} runs")
        print(f"{'policy':8} {'cpu':5} {'plan':>8} {'shadow':>7} {'on_iter':>8}"
              f" {'blk_start':>9} {'blk_end':>8} {'total':>8}"
              f" {'spread':>7} {'ms/fwd':>7} {'x lru':>6}" + ("  digest" if args.digest else ""))
        configs = [(policy, cpu) for policy in args.policies for cpu in ("auto", "off")]
        results = measure(work, configs, args.runs, args.digest)
        for (policy, cpu), (us, dig) in results.items():
            lru = results.get(("lru", cpu), (None,))[0]
            vs_lru = f"{us['total'] / lru['total']:6.2f}" if lru else f"{'-':>6}"
            print(f"{policy:8} {cpu:5} {us['plan']:8.1f} {us['shadow']:7.1f} {us['on_iteration']:8.1f} "
                  f"{us['on_block_start']:9.1f} "
                  f"{us['on_block_end']:8.1f} {us['total']:8.1f} {us['spread']:7.1f} "
                  f"{us['total'] * tr.num_layers / 1e3:7.3f} {vs_lru}" + (f"  {dig}" if args.digest else ""))
    print(f"\nplan = the critical path of a layer access; shadow = adaptive's deferred half (its shadow caches), "
          f"run once the layer is issued; "
          f"total = all controller calls per plan call (plan + shadow + events + block ends, amortised), "
          f"i.e. host us per "
          f"layer access; spread = max - min of the per-run totals; ms/fwd = total x MoE layers; x lru = total / "
          f"lru's total (same cpu mode). Budgets: small ~{BUDGET_US:.0f} us, mini at 40 % {MINI_BUDGET_US:.0f} us")
    print(f"\n(numpy {np.__version__}, torch {torch.__version__}, 1 thread)")


if __name__ == "__main__":
    main()
