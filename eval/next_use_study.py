"""Can online features rank experts by their next use? An LRB-style learned retention, fitted on dev, replayed held-out.

Why: the ladder (report section (i)) says the value of retention lies 4-16 accesses ahead (``foresight-K``
rungs), which one-iteration confidence cannot see. "Learning relaxed Belady" (LRB, NSDI 2020) learns the
next-use distance from online features; this study asks whether such features carry that information here,
before any such part is built into the product.

The predictor: a table of the mean ``log2`` next-use distance (accesses of the layer, capped at 1024) per
cell of online features, fitted on the dev trace (all layers pooled, a prior of 5 samples at the global mean):

* recency: accesses since the expert's last use (log buckets; never used);
* frequency: uses in the last 16 accesses of the layer;
* ``tokens`` (default) the tokens at its last use, ``gap`` the distance between its last two uses, or
  ``blocks`` how many of the last 4 blocks (the current one included) used it;
* the forward's denoising iteration within its block (prefill, 0, 1, 2, 3+).

Retention evicts the longest predicted next use (LRU breaks ties), under ``lru-full``'s dispatch and
allocation (the ladder's fair dispatch), lru-full and oled tuned as the report tunes them (on ``--tune``, the
deep toy's dev trace by default, as the report's every trace).
A study-only retention: it is registered for this run alone.

    .venv/bin/python eval/next_use_study.py traces/dev/deep-b16-bs1.trace traces/held-out/deep-b16-bs1.trace
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import numpy as np

import oled_hf.offload.system as system_module
from oled_hf.offload.costmodel import CostModel
from oled_hf.offload.policies.base import register
from oled_hf.offload.policies.lru import LRUPolicy
from oled_hf.offload.policies.oracle import next_use
from oled_hf.offload.trace import load_trace
from oled_hf.sim.bound import request_counts
from oled_hf.sim.ladder import FAIR_BASE, rung_system
from oled_hf.sim.replay import replay
from oled_hf.sim.report import SYSTEMS, slots_for, tune

WINDOW = 16  # accesses of the frequency feature
RECENCY = np.array([0, 1, 2, 4, 8, 16, 32, 64, 128])  # bucket edges; one more bucket: never used
FREQUENCY = np.array([0, 1, 2, 4, 8, 12, 16])
THIRD = np.array([0, 1, 2, 4, 8])  # tokens at the last use, the last gap, or blocks of the last 4 that used it
BLOCKS = 4
ITERATIONS = 5  # prefill, 0, 1, 2, 3+
NEVER = 10**6
CELLS = (len(RECENCY) + 1) * len(FREQUENCY) * len(THIRD) * ITERATIONS


def cell_of(recency: np.ndarray, freq: np.ndarray, third: np.ndarray, iteration: int) -> np.ndarray:
    rb = np.where(recency >= NEVER // 2, len(RECENCY), np.searchsorted(RECENCY, recency, side="right") - 1)
    fb = np.searchsorted(FREQUENCY, freq, side="right") - 1
    tb = np.searchsorted(THIRD, third, side="right") - 1
    return ((rb * len(FREQUENCY) + fb) * len(THIRD) + tb) * ITERATIONS + int(np.clip(iteration + 1, 0, 4))


class Features:
    """The online state of one layer's features (what a live policy would keep)."""

    def __init__(self, num_experts: int, third: str) -> None:
        self.t = -1
        self.last = np.full(num_experts, -NEVER)
        self.third_value = np.zeros(num_experts)
        self.hist = np.zeros((WINDOW, num_experts), dtype=bool)
        self.blocks = np.zeros((BLOCKS, num_experts), dtype=bool)  # a ring of the last blocks' expert sets
        self.block = 0
        self.third = third

    def update(self, counts: np.ndarray, new_block: bool) -> None:
        self.t += 1
        used = counts > 0
        if new_block:
            self.block = (self.block + 1) % BLOCKS
            self.blocks[self.block] = False
        self.blocks[self.block] |= used
        if self.third == "blocks":
            self.third_value = self.blocks.sum(axis=0).astype(np.float64)
        elif self.third == "tokens":
            self.third_value[used] = counts[used]
        else:
            self.third_value[used] = np.minimum(self.t - self.last[used], 64)
        self.last[used] = self.t
        self.hist[self.t % WINDOW] = used

    def cells(self, iteration: int) -> np.ndarray:
        return cell_of(self.t - self.last, self.hist.sum(axis=0), self.third_value, iteration)


def fit(trace, third: str) -> np.ndarray:
    """Mean log2 next-use distance per feature cell over the trace (a prior of 5 samples at the global mean)."""
    counts = request_counts(trace)
    iters = trace.arrays["fwd_iter"]
    total, n = np.zeros(CELLS), np.zeros(CELLS)
    for layer in range(counts.shape[0]):
        used = counts[layer] > 0
        dist = next_use(used) - np.arange(used.shape[0])[:, None]
        label = np.log2(np.minimum(dist, 1024).astype(np.float64))
        feats = Features(counts.shape[2], third)
        for t in range(used.shape[0]):
            feats.update(counts[layer, t], bool(iters[t] <= 0))  # a block's first iteration (or a prefill)
            c = feats.cells(int(iters[t]))
            np.add.at(total, c, label[t])
            np.add.at(n, c, 1.0)
    mean = total.sum() / n.sum()
    return (total + 5 * mean) / (n + 5)


@register
class LearnedNextUsePolicy(LRUPolicy):
    """Evict the longest predicted next use (the fitted table); LRU breaks ties (study only)."""

    name = "learned-next-use"

    def __init__(self, num_layers: int, num_experts: int, table: np.ndarray | None = None,
                 fwd_iter: np.ndarray | None = None, third: str = "tokens", **knobs: Any) -> None:
        super().__init__(num_layers, num_experts, **knobs)
        if table is None or fwd_iter is None:
            raise ValueError("learned-next-use needs the fitted table and the trace's fwd_iter")
        self.table, self.fwd_iter = table, fwd_iter
        self.feats = [Features(num_experts, third) for _ in range(num_layers)]
        self._prio = np.zeros((num_layers, num_experts))

    def _update(self, layer: int, ids: np.ndarray, weights: Any, counts: np.ndarray, clock: int) -> None:
        super()._update(layer, ids, weights, counts, clock)
        f = self.feats[layer]
        f.update(counts, bool(self.fwd_iter[f.t + 1] <= 0))

    def priority_array(self, layer: int) -> np.ndarray:
        f = self.feats[layer]
        np.add(-1e6 * self.table[f.cells(int(self.fwd_iter[f.t]))], self._last[layer], out=self._prio[layer])
        return self._prio[layer]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dev")
    p.add_argument("held_out")
    p.add_argument("--third", choices=("tokens", "gap", "blocks"), default="tokens",
                   help="the third feature: tokens at the last use, the gap between the last two uses, or how many "
                        "of the last 4 blocks used the expert")
    p.add_argument("--sizes", type=float, nargs="+", default=[15, 25, 40])
    p.add_argument("--tune", default="traces/dev/deep-b16-bs1.trace",
                   help="the dev trace lru-full and oled are tuned on (as the report tunes them)")
    args = p.parse_args()
    system_module.RETENTIONS = (*system_module.RETENTIONS, LearnedNextUsePolicy.name)  # study only
    dev, test = load_trace(args.dev), load_trace(args.held_out)
    table = fit(dev, args.third)
    cm = CostModel.h200_pcie5(2048, 512, kernel="grouped")
    specs = [s for s in SYSTEMS if s.name in (FAIR_BASE, "oled")]  # tuned on dev as the report tunes them
    tuned = {name: knobs for name, (knobs, _) in tune(load_trace(args.tune), specs, cm, 20e-6,
                                                        warmup_sequences=1).items()}
    fair, oled = (next(s for s in specs if s.name == n).system(tuned[n]) for n in (FAIR_BASE, "oled"))
    learned = dataclasses.replace(rung_system(fair, "lru", None), retention=LearnedNextUsePolicy.name).with_knobs(
        retention__table=table, retention__fwd_iter=test.arrays["fwd_iter"], retention__third=args.third)
    print(f"tuned on {args.tune}: {tuned}")
    print(f"table fitted on {args.dev} ({args.third}); held-out {args.held_out}; x fused, gain = lru's TPOT / it")
    for pct in args.sizes:
        size = slots_for(pct, test.num_experts)
        runs = {name: replay(test, name, size, system=s, cost_model=cm, planner_s=20e-6, warmup_sequences=1)
                for name, s in (("lru", rung_system(fair, "lru", None)), ("oled", oled), ("learned", learned))}
        print(f"{pct:g}%: " + "  ".join(f"{k} {r.ratio_to_full:.3f} (gain {runs['lru'].tpot_s / r.tpot_s:.3f})"
                                        for k, r in runs.items()), flush=True)


if __name__ == "__main__":
    main()
