"""Where ``oled-moe report`` tunes each trace's systems: the ``--dev`` trace, or a workload's own dev traces.

Why: the report tunes every system on one dev trace (the deep toy's), and a setting chosen there transfers
badly to another workload (on the mini-like workload oled's ``reuse_copies=1`` from the deep toy is 7% slower at
40% than the 2 its own dev seeds choose). ``--dev-for NAME=PATH[,PATH...]`` tunes the traces of workload
``NAME`` (a trace label, or a seed group ``NAME`` of traces ``NAME-s<seed>``) on those dev traces instead: every
system searches the same grid within the same budget, scored by its mean x fused over every dev trace and
headline size. Nothing is tuned on a held-out trace: a dev path that is also a held-out trace is refused.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np


@dataclass
class Tuning:
    """What one tuning chose: per system its knobs and every setting searched, and the dev profile."""

    source: str  # the dev traces, as the report names them
    knobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    searched: dict[str, list[tuple[dict[str, Any], float]]] = field(default_factory=dict)
    profile: np.ndarray | None = None

    def profile_for(self, num_layers: int, num_experts: int) -> np.ndarray | None:
        """The dev profile where its shape is the trace's (kTransformers' placement), else None."""
        p = self.profile
        return p if p is not None and p.shape == (num_layers, num_experts) else None


def parse_dev_for(values: list[str] | None, labels: list[str], held_out: list[str]) -> dict[str, list[str]]:
    """``["NAME=PATH[,PATH...]", ...]`` -> ``{NAME: [paths]}``, checked: NAME names a trace or a seed group of the
    report, each path is a file and none is a held-out trace, no NAME twice."""
    from ..sim.report_seeds import SEED_LABEL

    names = set(labels) | {m["base"] for m in map(SEED_LABEL.match, labels) if m}
    held = {Path(p).resolve() for p in held_out}
    out: dict[str, list[str]] = {}
    for value in values or []:
        name, sep, rest = value.partition("=")
        paths = [p for p in rest.split(",") if p]
        if not sep or not name or not paths:
            raise ValueError(f"--dev-for {value!r}: expected NAME=PATH[,PATH...] (NAME a trace label or a seed "
                             "group's name)")
        if name not in names:
            raise ValueError(f"--dev-for {value!r}: {name!r} names no trace or seed group of this report; allowed: "
                             f"{', '.join(sorted(names))}")
        if name in out:
            raise ValueError(f"--dev-for {value!r}: {name!r} is given twice")
        for p in paths:
            if not Path(p).is_file():
                raise ValueError(f"--dev-for {value!r}: trace {p}: no such file")
            if Path(p).resolve() in held:
                raise ValueError(f"--dev-for {value!r}: {p} is a held-out trace of this report; tune on dev traces "
                                 "only")
        out[name] = paths
    return out


def tune_on(paths: list[str], args: argparse.Namespace, planner: float | None) -> Tuning:
    """Every report system tuned on ``paths`` (mean x fused over them), each timed as the model it is like."""
    from ..offload.trace import load_trace
    from ..sim import report as rp
    from ..sim import report_seeds as rs
    from ..sim.hardware import MODEL_SHAPES, cost_model_from_args

    devs = []
    for path in paths:
        dev = load_trace(path)
        like = rs.like_model(str(dev.header.get("model", "")))
        cost = cost_model_from_args(dev, argparse.Namespace(**{**vars(args), "as_model": like if like in MODEL_SHAPES
                                                                else args.as_model}))
        n_seq = len(set(dev.arrays["fwd_seq"].tolist()))
        devs.append((dev, cost, min(args.warmup_sequences, n_seq - 1)))
    profile = rp.dev_profile(devs[0][0])
    tuning = Tuning(", ".join(f"`{Path(p).name}`" for p in paths), profile=profile)
    for name, (knobs, scores) in rp.tune_many(devs, rp.SYSTEMS, planner, profile=profile).items():
        tuning.knobs[name], tuning.searched[name] = knobs, scores
    return tuning


def tuning_for(label: str, default: Tuning, workloads: dict[str, Tuning]) -> Tuning:
    """A trace's tuning: its own workload's (by label, then by seed group), else the ``--dev`` one."""
    from ..sim.report_seeds import SEED_LABEL

    if label in workloads:
        return workloads[label]
    m = SEED_LABEL.match(label)
    return workloads.get(m["base"], default) if m else default
