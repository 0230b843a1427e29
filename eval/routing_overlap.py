"""Routing overlap between adjacent denoising iterations, from a recorded trace.

For consecutive denoising forwards of one sequence, per MoE layer: the fraction of the experts
routed in iteration i that are routed again in iteration i+1. Pairs inside one block and pairs
across a block boundary (last iteration of block b, first of block b+1) are reported apart, along
with distinct experts per layer per iteration: the locality a retention policy can exploit.

    .venv/bin/python eval/routing_overlap.py TRACE
"""

from __future__ import annotations

import argparse

import numpy as np

from oled_hf.sim.trace import load_trace


def overlap_stats(trace) -> dict:
    within, across, distinct = [], [], []
    prev = None
    for i in range(trace.num_forwards):
        f = trace.forward(i)
        if f.kind != "denoise":
            continue
        sets = [set(np.unique(f.topk_ids[layer]).tolist()) for layer in range(trace.num_layers)]
        distinct.append(np.mean([len(s) for s in sets]))
        if prev is not None and prev[0] == f.seq:
            ratio = np.mean([len(a & b) / max(len(a), 1) for a, b in zip(prev[2], sets)])
            (within if prev[1] == f.block_index else across).append(ratio)
        prev = (f.seq, f.block_index, sets)
    return {"within_block": (float(np.mean(within)) if within else None, len(within)),
            "across_blocks": (float(np.mean(across)) if across else None, len(across)),
            "distinct_experts_per_layer": float(np.mean(distinct)) if distinct else 0.0,
            "num_experts": trace.num_experts}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    args = p.parse_args()
    s = overlap_stats(load_trace(args.trace))
    print(f"{args.trace}: {s['distinct_experts_per_layer']:.1f} distinct experts per layer per iteration "
          f"(of {s['num_experts']})")
    for name in ("within_block", "across_blocks"):
        value, n = s[name]
        shown = "n/a" if value is None else f"{value:.3f}"
        print(f"  overlap {name.replace('_', ' ')}: {shown} over {n} adjacent pairs")


if __name__ == "__main__":
    main()
