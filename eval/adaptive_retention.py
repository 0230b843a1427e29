"""Does the ``adaptive`` retention part follow the best fixed rule when the workload shifts mid-run?

A run is a concatenation of segments (``oled_hf.sim.concat``): by default three synthetic ones whose
structure is controlled (``synthetic_trace`` knobs): *freq*, a stable hot set plus per-token noise
(no popularity drift: frequency pays), *recency*, a working set that drifts block to block (what was
hot a block ago is not hot now: recency pays), and *freq* again with another hot set. ``--traces``
adds a run joined from recorded traces of one model shape instead.

Each system is replayed over the whole run, the cache and the policy carried across the joins, at
15 / 25 / 40% of the experts, timed as LLaDA2.0-mini's experts on H200 + PCIe 5 (``--planner-us`` per
layer access on the critical path for every system; ``adaptive`` pays it again for each shadow plan,
on the host after the layer is issued, where replay lets it delay the next layer only as far as it
outlasts this layer's device work; the row ``adaptive, shadows in line`` makes the next layer wait
for them, ``replay(shadows_in_line=True)``, a host that cannot overlap them). A segment's time is
that of its sequences after its first ``--warmup`` ones, with everything before them run as warm-up
(``replay(take_sequences(run, end), warmup_sequences=start + warmup)``: segment times add up to the
run's exactly, tested); the overall time leaves out only the run's first ``--warmup`` sequences.
Printed and written to ``--out``: each system's time over the best fixed system's per segment and
overall (1.000 = as fast as the best fixed rule; above: slower).

    .venv/bin/python eval/adaptive_retention.py --out eval/adaptive_retention.md
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from oled_hf.fileio import write_atomically
from oled_hf.offload.config import OffloadConfig
from oled_hf.offload.controller import CacheController
from oled_hf.offload.costmodel import CostModel
from oled_hf.offload.policies.adaptive import AdaptivePolicy
from oled_hf.offload.system import parse_system
from oled_hf.offload.trace import OP_FORWARD, Trace, load_trace
from oled_hf.sim.concat import Segment, concat_traces, take_sequences
from oled_hf.sim.replay import replay
from oled_hf.sim.report import HEADLINE_PCT, md_table, slots_for
from oled_hf.sim.synthetic import synthetic_trace

FIXED = {"oled": "oled", "lru-full": "lru-full", "lfu-full": "lfu-full"}
ADAPTIVE = "adaptive+cpu+reuse+adaptive"
SHAPE = dict(num_layers=8, num_experts=64, top_k=4, block_length=32, num_blocks=4, prompt_length=16,
             hidden_size=2048, moe_intermediate_size=512)
# the controlled structure of each synthetic segment kind (synthetic_trace knobs)
KINDS = {"freq": dict(popularity_scale=2.5, drift=0.0, route_noise=1.5, stable_keep=0.5, confident_keep=0.5,
                      unsure_keep=0.2),
         "recency": dict(popularity_scale=0.5, drift=1.5, route_noise=0.5, stable_keep=0.99, confident_keep=0.97)}


def synthetic_run(kinds: list[str], sequences: int, seed: int) -> tuple[Trace, list[Segment]]:
    """The concatenation of one synthetic segment per kind, each with its own seed (its own hot set)."""
    parts = [synthetic_trace(**SHAPE, **KINDS[k], num_sequences=sequences, seed=seed + i, predict_keep=None)
             for i, k in enumerate(kinds)]
    return concat_traces(parts)


def time_run(run: Trace, segs: list[Segment], system: str, slots: int, cm: CostModel, planner_s: float,
             warmup: int, inline: bool = False) -> list[float]:
    """Simulated seconds of each segment after its warm-up, then of the whole run after the first warm-up."""
    out = []
    for s in segs:
        if s.num_sequences <= warmup:
            raise ValueError(f"a segment has {s.num_sequences} sequences; --warmup={warmup} leaves nothing to time")
        head = run if s.end_sequence == segs[-1].end_sequence else take_sequences(run, s.end_sequence)
        out.append(replay(head, system, slots, system=system, cost_model=cm, planner_s=planner_s,
                          warmup_sequences=s.start_sequence + warmup, shadows_in_line=inline).sim_time_s)
    out.append(replay(run, system, slots, system=system, cost_model=cm, planner_s=planner_s,
                      warmup_sequences=warmup, shadows_in_line=inline).sim_time_s)
    return out


def followed(run: Trace, slots: int, cm: CostModel) -> tuple[np.ndarray, tuple[str, ...]]:
    """Which candidate ``adaptive`` follows at each layer after each forward ([forwards, layers] indices).

    The controller's calls in replay's order (plan, its deferred shadows, events): the same decisions.
    """
    ctrl = CacheController(OffloadConfig(cache_size=slots, system=ADAPTIVE), run.num_layers, run.num_experts, cm)
    out = []
    for op, idx in run.ops():
        if op == OP_FORWARD:
            ctrl.begin_forward()
            ids, weights = run.routing(idx)
            for layer in range(run.num_layers):
                ctrl.plan(layer, ids[layer], weights[layer])
                ctrl.run_shadows()
            out.append(ctrl.policy.choice.copy())
        else:
            run.deliver(ctrl, op, idx)
    return np.array(out), ctrl.policy.names


def plot_followed(runs: list[tuple[str, Trace, list[Segment], list[str]]], pcts: list[float], path: str) -> None:
    """One panel per run and size: layers x forwards, coloured by the candidate followed; segment starts marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    cm = CostModel.h200_pcie5(2048, 512, kernel="grouped")
    fig, axes = plt.subplots(len(pcts), len(runs), figsize=(6 * len(runs), 1.0 + 1.6 * len(pcts)), squeeze=False)
    colours = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:grey"]
    for c, (name, run, segs, labels) in enumerate(runs):
        for r, pct in enumerate(pcts):
            choice, names = followed(run, slots_for(pct, run.num_experts), cm)
            ax = axes[r][c]
            ax.imshow(choice.T, aspect="auto", interpolation="nearest", vmin=0, vmax=len(colours) - 1,
                      cmap=ListedColormap(colours))
            for s, lab in zip(segs, labels):
                ax.axvline(s.start_forward - 0.5, color="black", linewidth=1)
                ax.text(s.start_forward + 1, -0.7, lab, fontsize=7, va="bottom")
            ax.set_ylabel(f"{pct:g}%: layer")
            if r == len(pcts) - 1:
                ax.set_xlabel("forward")
            if r == 0:
                ax.set_title(name, fontsize=9, pad=16)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[i]) for i in range(len(names))]
    fig.legend(handles, names, loc="upper right", fontsize=8, title="followed")
    fig.tight_layout(rect=(0, 0, 0.93, 1))
    write_atomically(lambda tmp: fig.savefig(tmp, dpi=110, format="png"), path)
    print(f"wrote {path}")


def _knob(text: str) -> tuple[str, object]:
    """``KNOB=VALUE`` of ``--also``: the value a number where it reads as one, checked by the part itself."""
    key, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"--also {text!r} is invalid: must be KNOB=VALUE (an adaptive knob)")
    try:
        val: object = int(value) if value.isdigit() else float(value)
    except ValueError:
        val = value
    AdaptivePolicy(1, 8, **{key: val})  # an unknown knob or a bad value: its one-line error
    return key, val


def study(name: str, run: Trace, segs: list[Segment], labels: list[str], args) -> str:
    """The Markdown table of one run: per size, every system's time over the best fixed one's, per segment."""
    cm = CostModel.h200_pcie5(2048, 512, kernel="grouped")
    systems = [(n, s, False) for n, s in FIXED.items()]
    systems += [("adaptive", ADAPTIVE, False), ("adaptive, shadows in line", ADAPTIVE, True)]
    systems += [(f"adaptive, {k}={v}", parse_system(ADAPTIVE).with_knobs(**{f"retention.{k}": v}), False)
                for k, v in args.also]
    cols = [f"{lab} ({s.num_sequences - args.warmup} seq)" for lab, s in zip(labels, segs)] + ["overall"]
    rows = []
    for pct in args.pct:
        slots = slots_for(pct, run.num_experts)
        times = {n: time_run(run, segs, s, slots, cm, args.planner_us * 1e-6, args.warmup, inline)
                 for n, s, inline in systems}
        best = [min(times[n][i] for n in FIXED) for i in range(len(cols))]
        for n, _, _ in systems:
            ratios = [t / b for t, b in zip(times[n], best)]  # the overall to 4 places: ties are common there
            rows.append([f"{pct:g}%", n] + [f"{r:.3f}" for r in ratios[:-1]] + [f"{ratios[-1]:.4f}"])
        print(f"  {pct:g}% done", flush=True)
    return (f"### {name}\n\n{run.num_layers} MoE layers x {run.num_experts} experts, top-{run.header['top_k']}; "
            f"segments {' -> '.join(labels)}; warm-up {args.warmup} sequence(s) per segment; time over the best "
            f"fixed system's (oled, lru-full, lfu-full) in each column\n\n"
            + md_table(["cache", "system"] + cols, rows) + "\n")


def recorded_run(paths: list[str], take: int, warmup: int) -> tuple[Trace, list[Segment]] | None:
    """The traces joined in order (the first ``take`` sequences of each), or None without any; a missing, empty or
    unreadable trace, traces of different shapes, or one with no sequence past the warm-up: one ValueError."""
    if not paths:
        return None
    parts = []
    for path in paths:
        if not Path(path).is_file():
            raise ValueError(f"--traces {path}: no such file")
        if Path(path).stat().st_size == 0:
            raise ValueError(f"--traces {path}: the file is empty (not a trace; record one with oled-moe trace record)")
        trace = load_trace(path)
        sequences = len(set(trace.arrays["fwd_seq"].tolist()))
        if trace.num_forwards == 0 or sequences == 0:
            raise ValueError(f"--traces {path}: the trace holds no forward (record one with oled-moe trace record)")
        if take:
            trace, sequences = take_sequences(trace, min(take, sequences)), min(take, sequences)
        if sequences <= warmup:
            raise ValueError(f"--traces {path}: {sequences} sequence(s), none left after --warmup {warmup}; "
                             "record more or lower --warmup")
        parts.append(trace)
    try:
        return concat_traces(parts)
    except ValueError as e:  # "trace 1 has num_moe_layers=3, trace 0 ...": which files those are
        numbered = ", ".join(f"{i}: {p}" for i, p in enumerate(paths))
        raise ValueError(f"--traces ({numbered}): {e}") from None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="write the Markdown tables here (refused if it exists, unless --overwrite)")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--segments", nargs="+", default=["freq", "recency", "freq"], choices=sorted(KINDS))
    p.add_argument("--sequences", type=int, default=6, help="sequences per synthetic segment")
    p.add_argument("--warmup", type=int, default=2, help="sequences at the start of each segment left untimed")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--traces", nargs="*", default=[], help="recorded traces of one model shape, joined in order")
    p.add_argument("--take", type=int, default=0, help="use only the first N sequences of each trace (0: all)")
    p.add_argument("--pct", nargs="+", type=float, default=list(HEADLINE_PCT))
    p.add_argument("--planner-us", type=float, default=20.0, help="planner time per layer access, fixed rules")
    p.add_argument("--png", help="plot which candidate adaptive follows, per layer and forward (refused if it exists)")
    p.add_argument("--also", nargs="+", default=[], metavar="KNOB=VALUE",
                   help="an extra adaptive row per adaptive knob setting (e.g. switch_cost=transition)")
    args = p.parse_args()
    try:
        args.also = [_knob(a) for a in args.also]
    except ValueError as e:
        p.error(str(e))
    for flag, path in (("--out", args.out), ("--png", args.png)):
        if path and Path(path).exists() and not args.overwrite:
            p.error(f"{flag} {path} exists; pass --overwrite to replace it")
    if args.take < 0:
        p.error(f"--take={args.take} is invalid: must be 0 (all) or a number of sequences >= 1")
    if args.sequences < 1 or args.warmup < 0 or args.warmup >= args.sequences:
        p.error(f"--sequences={args.sequences}, --warmup={args.warmup}: need sequences >= 1, 0 <= warmup < sequences")
    if not all(0 < x <= 100 for x in args.pct) or args.planner_us < 0:
        p.error("--pct values must be in (0, 100] and planner times >= 0")
    try:  # before the synthetic study's minutes: a bad trace is one line now, not a traceback after them
        recorded = recorded_run(args.traces, args.take, args.warmup)
    except (OSError, ValueError) as e:
        p.error(" ".join(str(e).split()))
    t0 = time.perf_counter()
    tables = []
    run, segs = synthetic_run(args.segments, args.sequences, args.seed)
    print(f"synthetic run: {run.num_forwards} forwards, {len(segs)} segments", flush=True)
    tables.append(study("Synthetic segments", run, segs, args.segments, args))
    runs = [("synthetic", run, segs, args.segments)]
    if recorded is not None:
        run, segs = recorded
        labels = [Path(t).stem for t in args.traces]
        tables.append(study("Recorded traces", run, segs, labels, args))
        runs.append(("recorded: " + " -> ".join(labels), run, segs, labels))
    if args.png:
        plot_followed(runs, args.pct, args.png)
    text = "\n".join(tables) + f"\nrun time {time.perf_counter() - t0:.0f} s\n"
    print("\n" + text, flush=True)
    if args.out:
        write_atomically(lambda tmp: Path(tmp).write_text(text), args.out)


if __name__ == "__main__":
    main()
