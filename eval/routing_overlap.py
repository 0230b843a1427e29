"""Routing statistics of a recorded trace, printed and (``--plot``) drawn, next to LLaDA2.0-mini's.

Per MoE layer: distinct experts per iteration, activation ratio (per iteration and per block),
overlap of adjacent iterations' expert sets inside a block and across a block boundary, the
cosine similarity of adjacent iterations' per-expert token counts, and route persistence
against token confidence (the OLED paper's Figures 7 and 10); see ``oled_hf/sim/routing_stats.py``.

    .venv/bin/python eval/routing_overlap.py TRACE [--plot routing.png] [--json stats.json]
    .venv/bin/python eval/routing_overlap.py --long [--n-per-task 25] --plot routing.png
        # records a trace of the long-answer toy on held-out prompts first (block 16, threshold 0.95)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a clone without installing
    sys.path.insert(0, str(ROOT))

from oled_hf.fileio import check_new_file, write_atomically, write_text_atomically  # noqa: E402
from oled_hf.offload.trace import load_trace  # noqa: E402
from oled_hf.sim.routing_stats import routing_stats  # noqa: E402

# Published for LLaDA2.0-mini (shared/docs/peers.md): block 32 x top-8 over 256 experts per layer.
MINI = {"distinct_per_step": 69.5, "num_experts": 256, "routes_per_step": 256, "activation_cosine": 0.985,
        "source": "dMoE (arXiv 2605.30876) unique experts per block step; TIDE (arXiv 2605.20179) cross-step "
                  "cosine similarity of expert activations"}


def overlap_stats(trace) -> dict:
    """The summary this script printed before the full statistics (kept for callers of that API)."""
    s = routing_stats(trace).summary()
    return {"within_block": (s["overlap_within_block"]["mean"], s["overlap_within_block"]["pairs"]),
            "across_blocks": (s["overlap_across_blocks"]["mean"], s["overlap_across_blocks"]["pairs"]),
            "distinct_experts_per_layer": s["distinct_experts_per_iteration"]["mean"] or 0.0,
            "num_experts": trace.num_experts}


def layer_numbering(trace) -> tuple[str, list[int]]:
    """How to name the trace's MoE layers: decoder-layer numbers (1-based, ``model.layers[n - 1]``,
    as ``/stats`` and ``/metrics`` name them) when the trace or its model's config.json says how many
    dense layers come first; MoE-layer numbers otherwise (traces recorded before the header had it)."""
    dense = trace.header.get("first_k_dense_replace")
    if dense is None:
        config = Path(str(trace.header.get("model", ""))) / "config.json"
        try:
            dense = json.loads(config.read_text()).get("first_k_dense_replace")
        except (OSError, ValueError):
            dense = None
    if dense is None:
        return "MoE layer", list(range(1, trace.num_layers + 1))
    from types import SimpleNamespace

    from oled_hf.serve.metrics import moe_layer_numbers

    return "decoder layer", moe_layer_numbers(SimpleNamespace(first_k_dense_replace=int(dense)), trace.num_layers)


def _fmt(x, spec=".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def format_report(s: dict, name: str) -> str:
    d = s["distinct_experts_per_iteration"]
    lines = [f"{name}: {s['steps']} denoising iterations over {s['blocks']} blocks "
             f"({_fmt(s['iterations_per_block'], '.2f')} iterations/block); "
             f"block {s['block_length']} x top-{s['top_k']} = {s['routes_per_step']} routes per iteration "
             f"over {s['num_experts']} experts per layer",
             f"{s.get('layer_label', 'MoE layer')}s numbered as in model.layers (1-based)"
             if s.get("layer_label") == "decoder layer" else "layers: MoE layers in order (1-based)",
             f"{'layer':<7}{'distinct/iter':>14}{'act/iter':>10}{'act/block':>10}{'overlap in':>11}"
             f"{'overlap across':>15}"]
    numbers = s.get("layer_numbers") or list(range(1, len(d["per_layer"]) + 1))
    for i, v in enumerate(d["per_layer"]):
        lines.append(f"{numbers[i]:<7}{_fmt(v, '.1f'):>14}{_fmt(s['activation_ratio_per_iteration'][i]):>10}"
                     f"{_fmt(s['activation_ratio_per_block'][i]):>10}"
                     f"{_fmt(s['overlap_within_block']['per_layer'][i]):>11}"
                     f"{_fmt(s['overlap_across_blocks']['per_layer'][i]):>15}")
    lines.append(f"{'all':<7}{_fmt(d['mean'], '.1f'):>14}{'':>10}{'':>10}{_fmt(s['overlap_within_block']['mean']):>11}"
                 f"{_fmt(s['overlap_across_blocks']['mean']):>15}")
    lines.append(f"activation cosine of adjacent iterations: within block {_fmt(s['activation_cosine_within_block'])}, "
                 f"across blocks {_fmt(s['activation_cosine_across_blocks'])}")
    lines.append("route persistence (share of a token's top-k kept into the next iteration) by its state:")
    for state, v in s["persistence_by_state"].items():
        if v["tokens"]:
            lines.append(f"  {state:<20} {_fmt(v['mean'])}  ({v['tokens']} token-steps per layer)")
    ratio = d["mean"] / s["routes_per_step"] if d["mean"] else None
    lines.append(f"LLaDA2.0-mini (published): {MINI['distinct_per_step']} distinct of {MINI['num_experts']} per block "
                 f"step = {MINI['distinct_per_step'] / MINI['routes_per_step']:.2f} per route "
                 f"({MINI['distinct_per_step'] / MINI['num_experts']:.2f} of the layer); activation cosine "
                 f"{MINI['activation_cosine']}. Here: {_fmt(ratio, '.2f')} per route "
                 f"({_fmt(d['mean'] / s['num_experts'] if d['mean'] else None, '.2f')} of the layer).")
    return "\n".join(lines)


def plot(s: dict, path: str, title: str) -> None:
    """Four panels: distinct experts, overlaps, activation ratios per layer; persistence by token state."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = np.asarray(s.get("layer_numbers") or range(1, len(s["distinct_experts_per_iteration"]["per_layer"]) + 1))
    xlabel = s.get("layer_label", "MoE layer")
    nan = lambda v: [np.nan if x is None else x for x in v]  # noqa: E731
    fig, ax = plt.subplots(2, 2, figsize=(11, 8))
    a = ax[0, 0]
    a.bar(layers, nan(s["distinct_experts_per_iteration"]["per_layer"]), color="tab:blue", label="this model")
    a.axhline(MINI["distinct_per_step"] * s["routes_per_step"] / MINI["routes_per_step"], color="tab:red", ls="--",
              label="LLaDA2.0-mini, scaled to these routes")
    a.set(title="distinct experts per layer per iteration", xlabel=xlabel, ylabel="experts")
    a.legend(fontsize=8)
    a = ax[0, 1]
    w = 0.38
    a.bar(layers - w / 2, nan(s["overlap_within_block"]["per_layer"]), w, label="adjacent iterations, same block")
    a.bar(layers + w / 2, nan(s["overlap_across_blocks"]["per_layer"]), w, label="across a block boundary")
    a.set(title="share of iteration i+1's experts used at i", xlabel=xlabel, ylim=(0, 1))
    a.legend(fontsize=8)
    a = ax[1, 0]
    a.bar(layers - w / 2, nan(s["activation_ratio_per_iteration"]), w, label="per iteration")
    a.bar(layers + w / 2, nan(s["activation_ratio_per_block"]), w, label="per block (union)")
    a.axhline(MINI["distinct_per_step"] / MINI["num_experts"], color="tab:red", ls="--",
              label="LLaDA2.0-mini per block step")
    a.set(title="activation ratio (experts used / experts)", xlabel=xlabel, ylim=(0, 1))
    a.legend(fontsize=8)
    a = ax[1, 1]
    states = [k for k, v in s["persistence_by_state"].items() if v["tokens"]]
    for i in range(len(layers)):
        a.plot(range(len(states)), nan([s["persistence_by_state"][k]["per_layer"][i] for k in states]), marker="o",
               label=f"{xlabel} {layers[i]}")
    a.set_xticks(range(len(states)), states, rotation=35, ha="right", fontsize=8)
    a.set(title="route persistence i -> i+1 by token state at i", ylabel="share of top-k kept", ylim=(0, 1))
    a.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    kind = Path(path).suffix.lstrip(".") or "png"  # the temporary file's name says nothing of the format
    try:
        write_atomically(lambda tmp: fig.savefig(tmp, dpi=110, format=kind), path)
    finally:
        plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", nargs="?", help="a trace recorded by `oled-moe trace record` (omit with --long)")
    p.add_argument("--long", action="store_true", help="record the long-answer toy on held-out prompts first")
    p.add_argument("--model", default=None, help="with --long: the checkpoint (default: the shipped one)")
    p.add_argument("--n-per-task", type=int, default=25, help="with --long: held-out prompts per task")
    p.add_argument("--block-length", type=int, default=None, help="with --long (default: the checkpoint's)")
    p.add_argument("--threshold", type=float, default=None, help="with --long (default: the checkpoint's)")
    p.add_argument("--save-trace", default=None, help="with --long: keep the recorded trace here")
    p.add_argument("--plot", default=None, help="write the figure (PNG) here")
    p.add_argument("--json", default=None, help="write the statistics (JSON) here")
    p.add_argument("--overwrite", action="store_true", help="replace existing --plot/--json/--save-trace files")
    args = p.parse_args(argv)
    if args.long == bool(args.trace):
        p.error("give a TRACE or --long (not both)")
    for flag in ("plot", "json", "save_trace"):  # before minutes of recording: refuse, do not replace
        out = getattr(args, flag)
        if out and Path(out).exists() and not args.overwrite:
            p.error(f"--{flag.replace('_', '-')} {out} exists; give a new path or pass --overwrite to replace it")
        if out:  # a folder, a missing or read-only folder
            try:
                check_new_file(out, overwrite=True, field=f"--{flag.replace('_', '-')}")
            except ValueError as err:
                p.error(str(err))
    with tempfile.TemporaryDirectory() as tmp:
        path = args.trace
        if args.long:
            from oled_hf.toy.long import LONG_CHECKPOINT
            from oled_hf.toy.long.traces import record_trace

            path = args.save_trace or str(Path(tmp) / "long.pt")
            r = record_trace(path, args.model or LONG_CHECKPOINT, n_per_task=args.n_per_task,
                             block_length=args.block_length, threshold=args.threshold, overwrite=args.overwrite)
            print(f"recorded {r['prompts']} held-out prompts, {r['forwards']} forwards -> {r['path']}")
        trace = load_trace(path)
        s = routing_stats(trace).summary()
        s["layer_label"], s["layer_numbers"] = layer_numbering(trace)
    name = "long-answer toy (held-out)" if args.long else args.trace
    print(format_report(s, name))
    if args.json:
        write_text_atomically(json.dumps(s, indent=2) + "\n", args.json)
    if args.plot:
        plot(s, args.plot, f"routing of {name}, block {s['block_length']}")
        print(f"figure -> {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
