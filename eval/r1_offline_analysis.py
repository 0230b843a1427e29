"""Issue 36 (2), engineer R1: what the greedy offline schedule does differently from oled, and why it is faster.

Replays ``oled_hf.sim.offline.greedy_schedule``'s rules (Belady retention; per access the copied
prefix ``k`` of the admitted misses, largest CPU time first, that ends the access earliest on the
timeline; a miss admitted only with a free slot or a victim used later than it) with counters, and
ablates them: ``--no-filter`` (a miss may evict any idle resident, the farthest-used one),
``--k all`` (copy every admitted miss), ``--k none`` (copy nothing). Prints copies per access,
CPU-served misses, the copy engine's busy share, and the reuse distance (accesses of the same layer
to the next use) and tokens of copied vs CPU-served misses.

    .venv/bin/python eval/r1_offline_analysis.py TRACE [--pct 40] [--no-filter] [--k greedy|all|none]
"""

from __future__ import annotations

import argparse
import copy as _copy

import numpy as np

from oled_hf.offload.costmodel import CostModel
from oled_hf.offload.trace import load_trace
from oled_hf.sim.belady import INF
from oled_hf.sim.bound import request_counts, timed_forwards
from oled_hf.sim.lp_bound import full_time
from oled_hf.sim.offline import _next_uses, accesses_of, charge_access
from oled_hf.sim.report import slots_for
from oled_hf.sim.timeline import Timeline


def analyse(accs, cm, total_slots, timed_from, filt=True, k_rule="greedy", retention="belady"):
    nxt = nxt0 = _next_uses(accs)
    if retention == "lru":  # an online retention: the key is minus the last use (the largest is the oldest)
        filt = False
        nxt = [{e: -t for e in d} for t, d in enumerate(nxt)]
    layer_pos = np.zeros(len(accs), dtype=np.int64)  # index of each access among its layer's
    seen: dict[int, int] = {}
    for t, a in enumerate(accs):
        layer_pos[t] = seen.get(a.layer, 0)
        seen[a.layer] = layer_pos[t] + 1
    cache: dict[tuple[int, int], int] = {}
    tl, ready = Timeline(cm.copy_time()), {}
    t0 = 0.0
    st = {"acc": 0, "hits": 0, "miss": 0, "copy": 0, "cpu": 0, "filtered": 0, "k_cut": 0, "dead": 0}
    rd_copy, rd_cpu, tok_copy, tok_cpu = [], [], [], []
    for t, acc in enumerate(accs):
        timed = t >= timed_from
        if t == timed_from:
            t0 = max(tl.gpu_free, tl.host_free)
        req = np.flatnonzero(acc.counts).tolist()
        hits = [e for e in req if (acc.layer, e) in cache]
        misses = sorted((e for e in req if (acc.layer, e) not in cache),
                        key=lambda e: -float(cm.cpu_times(acc.counts[[e]])[0]))
        for e in hits:
            cache[(acc.layer, e)] = nxt[t][e]
        protected = {(acc.layer, e) for e in hits}
        admits = []
        trial = dict(cache)
        nfilt = 0
        for e in misses:
            if retention == "belady" and nxt[t][e] >= INF:
                nfilt += 1
                continue
            victim = None
            if len(trial) >= total_slots:
                idle = [(u, it) for it, u in trial.items() if it not in protected]
                if not idle:
                    continue
                u, victim = max(idle)
                if filt and u <= nxt[t][e]:
                    nfilt += 1
                    continue
                del trial[victim]
            trial[(acc.layer, e)] = nxt[t][e]
            protected.add((acc.layer, e))
            admits.append((e, victim))
        if k_rule == "all":
            best_k = len(admits)
        elif k_rule == "none":
            best_k = 0
        else:
            best_k, best_end = 0, np.inf
            for k in range(len(admits) + 1):
                copied = [e for e, _ in admits[:k]]
                end = charge_access(_copy.deepcopy(tl), acc, hits, copied, [e for e in misses if e not in copied],
                                    cm, dict(ready))
                if end < best_end - 1e-15:
                    best_k, best_end = k, end
        copied = [e for e, _ in admits[:best_k]]
        for e, victim in admits[:best_k]:
            if victim is not None:
                cache.pop(victim, None)
            cache[(acc.layer, e)] = nxt[t][e]
        cpu = [e for e in misses if e not in copied]
        if timed:
            st["acc"] += 1
            st["hits"] += len(hits)
            st["miss"] += len(misses)
            st["copy"] += len(copied)
            st["cpu"] += len(cpu)
            st["filtered"] += nfilt
            st["k_cut"] += len(admits) - best_k
            for e in misses:
                nu = nxt0[t][e]
                rd = INF if nu >= INF else int(layer_pos[nu] - layer_pos[t])
                (rd_copy if e in copied else rd_cpu).append(rd)
                (tok_copy if e in copied else tok_cpu).append(int(acc.counts[e]))
        charge_access(tl, acc, hits, copied, cpu, cm, ready)
    span = max(tl.gpu_free, tl.host_free) - t0
    return span, st, np.array(rd_copy), np.array(rd_cpu), np.array(tok_copy), np.array(tok_cpu)


def describe(name, xs):
    if xs.size == 0:
        return f"{name}: none"
    fin = xs[xs < INF]
    q = np.percentile(fin, [25, 50, 75]) if fin.size else [np.nan] * 3
    return (f"{name}: n={xs.size}, never again {np.mean(xs >= INF):.1%}, "
            f"quartiles {q[0]:.0f}/{q[1]:.0f}/{q[2]:.0f}, mean(finite) {fin.mean() if fin.size else np.nan:.1f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--pct", type=float, default=40)
    p.add_argument("--no-filter", action="store_true")
    p.add_argument("--k", choices=("greedy", "all", "none"), default="greedy")
    p.add_argument("--retention", choices=("belady", "lru"), default="belady")
    a = p.parse_args()
    trace = load_trace(a.trace)
    cm = CostModel.h200_pcie5(2048, 512, kernel="grouped")
    counts = request_counts(trace)
    timed = timed_forwards(trace, 1)
    full = full_time(counts, timed, cm)
    last = int(np.flatnonzero(timed)[-1]) + 1
    first = int(np.flatnonzero(timed)[0])
    accs = accesses_of(counts, np.arange(last))
    total = slots_for(a.pct, trace.num_experts) * trace.num_layers
    span, st, rdc, rdu, tc, tu = analyse(accs, cm, total, first * trace.num_layers, not a.no_filter, a.k,
                                       a.retention)
    n = st["acc"]
    print(f"{a.trace} {a.pct:g}% retention={a.retention} filter={not a.no_filter} k={a.k}: "
          f"{span / full:.3f} x fused; per access: "
          f"hits {st['hits'] / n:.2f} misses {st['miss'] / n:.2f} copies {st['copy'] / n:.2f} "
          f"cpu {st['cpu'] / n:.2f} (filtered {st['filtered'] / n:.2f}, cut by k {st['k_cut'] / n:.2f}); "
          f"copy engine busy {st['copy'] * cm.copy_time() / span:.1%}")
    print("  " + describe("copied reuse distance", rdc))
    print("  " + describe("cpu-served reuse distance", rdu))
    print(f"  tokens: copied mean {tc.mean() if tc.size else 0:.1f}, cpu-served mean {tu.mean() if tu.size else 0:.1f}")


if __name__ == "__main__":
    main()
