"""The evaluation of recorded traces: every system built from the same parts, tuned the same way.

``oled-moe report TRACE... --dev DEV_TRACE --out DIR`` replays each trace through every system below,
timed as the chosen model on H200 + PCIe 5 (``oled_hf.sim.hardware``), and writes ``report.md`` plus
PNG plots:

(a) TPOT (ratio to fused residency and to the valid bound) and cache utilization vs cache size;
(b) gap to the ideal: hit rate / Belady MIN (the MIN each run can reach: demand MIN for uniform runs
    that copy every miss, with bypass otherwise, ``replay.hit_bound``) and TPOT / the valid bound
    (``sim/bounds/lp.py``: every expert entering the cache pays a copy; windows of ``lp_window``
    forwards). The old MIN bound (``sim/bounds/physical.py``) is shown beside it, labelled for what it is: its
    CPU-served misses enter the cache free, so it is lower and looser;
(c) ablation: the strongest fair baseline -> + confidence retention -> + layer-adaptive -> + reuse-aware
    compensation, each step changing one part;
(d) block length x cache size and (e) batch size, from traces that differ only in that setting;
(f) PCIe 16/32/64 GB/s; (g) planner/policy host time per forward;
(h) mis-calibration: every system's dispatcher believing the CPU or PCIe 0.25x-4x as fast as it is;
(i) the oracle ladder (``sim/ladder.py``); (j) the optimum bracketed at 40% (the LP bound below, the best
    offline schedule above, ``sim/schedules/best.py``) and oled's time above the bound decomposed
    (``sim/decompose.py``).

Every system is a composition of parts (``oled_hf.offload.system``): a published system is the
composition its paper builds, and the strongest compositions of our own parts (``lru-full``,
``lfu-full``) are baselines too. Every system gets the same tuning budget, at most ``TUNING_BUDGET``
settings of its own knobs (``ReportSystem.grid``), chosen on the dev split only (mean TPOT / fused at
15/25/40%); the held-out traces are then replayed once per system with its chosen setting.

Utilization (peers.md section 3): ``U_slot`` = hits / (slots x layer accesses); ``copies used`` =
fraction of copied experts hit again before eviction. Everything here is pure data plus formatting;
the plots live in ``plots.py`` and the command in ``oled_hf/cli/report.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from oled_hf.offload.costmodel import CostModel
from oled_hf.offload.system import System, parse_system

from ..offload.trace import Trace
from .bounds import lower_bound
from .demand import request_counts
from .replay import ReplayResult, hit_bound, min_footnote, replay
from .report_calibration import calibrated

SIZES_PCT = (10, 15, 25, 40, 60, 100)
HEADLINE_PCT = (15, 25, 40)
PCIE_GBPS = (16, 32, 64)
BELIEF_FACTORS = (0.25, 0.5, 2.0, 4.0)
TUNING_BUDGET = 4  # settings per system searched on the dev split
OURS = "oled"


@dataclass
class ReportSystem:
    """One row of the systems table: a name, its parts, what it models, and its tuning grid."""

    name: str
    parts: str  # a --system string
    models: str
    grid: list[dict[str, Any]] = field(default_factory=lambda: [{}])  # knob settings searched on dev
    dev_profile: bool = False  # static placement profiled on the dev split (kTransformers/Fiddler)

    def __post_init__(self) -> None:
        if not 1 <= len(self.grid) <= TUNING_BUDGET:
            raise ValueError(f"system {self.name!r} searches {len(self.grid)} settings; the budget is "
                             f"1..{TUNING_BUDGET}")
        parse_system(self.parts)

    def system(self, knobs: dict[str, Any] | None = None) -> System:
        return parse_system(self.parts).with_knobs(**{k.replace(".", "__", 1): v for k, v in (knobs or {}).items()})


# 0 reuse copies: the amortised split (dispatch ``cpu``), each copy spread over the policy's predicted reuse:
# the usage EMA's for lru and lfu; oled's is one iteration ahead there, so its setting reads the usage EMA too
# (``policies/oled.py`` rule 8; eval/ablate_parts.py found the amortised split is what HybriMoE wins by on flash-like)
_REUSE_GRID = [{"dispatch.reuse_copies": n} for n in (1, 2, 4, 0)]
_OLED_GRID = _REUSE_GRID[:3] + [{"dispatch.reuse_copies": 0, "retention.reuse": "usage", "retention.usage_decay": 0.9}]
# what the shadows are scored on, and the dispatch's reuse copies as every cpu+reuse system tunes them
# (without the latter its dev score differed from oled's by the dispatch alone)
_ADAPTIVE_GRID = [{"retention.cost": c, "dispatch.reuse_copies": n} for c in ("misses", "time") for n in (1, 2)]
SYSTEMS = (
    ReportSystem("oled", "oled", "OLED-MoE (this project): confidence retention, layer-adaptive, "
                 "CPU per access + reuse copies", _OLED_GRID),
    ReportSystem("lru-full", "lru-full", "our strongest LRU composition: LRU + the same dispatch and allocation",
                 _REUSE_GRID),
    ReportSystem("lfu-full", "lfu-full", "our strongest LFU composition: LFU + the same dispatch and allocation",
                 _REUSE_GRID),
    ReportSystem("adaptive", "adaptive+cpu+reuse+adaptive", "our parts with retention that follows the best of "
                 "oled / lru / lfu on shadow caches (policies/adaptive.py)", _ADAPTIVE_GRID),
    ReportSystem("learned", "learned+cpu+reuse+adaptive", "our parts with retention by a reuse predictor learned "
                 "online (policies/learned.py; the default system's parts)", _REUSE_GRID),
    ReportSystem("mixtral-offloading", "mixtral-offloading", "Mixtral-offloading: per-layer LRU, every miss copied"),
    ReportSystem("hybrimoe", "hybrimoe", "HybriMoE: score-EMA cache, capped next-layer prefetch, hybrid CPU-GPU split",
                 [{"retention.decay": d, "prefetch.limit": n} for d in (0.5, 0.9) for n in (4, 16)]),
    ReportSystem("ktransformers", "ktransformers", "kTransformers / Fiddler: placement profiled on the dev split, "
                 "misses on the CPU", [{}], dev_profile=True),
    ReportSystem("tide", "tide", "TIDE: top-by-tokens refresh every tau iterations (tau chosen on dev), misses on CPU",
                 [{"retention.interval": t} for t in (1, 2, 4, 8)]),
    ReportSystem("moe-infinity", "moe-infinity", "MoE-Infinity: activation-matrix prefetch, priority eviction, copy"),
    ReportSystem("moe-infinity+cpu", "moe-infinity+cpu", "MoE-Infinity's parts with the amortised CPU dispatch"),
    ReportSystem("promoe", "promoe", "ProMoE-style: next-layer prefetch capped by predicted benefit, demand first",
                 [{"prefetch.limit": n} for n in (2, 4, 8, 16)]),
)


def slots_for(pct: float, num_experts: int) -> int:
    """Slots per MoE layer for a cache of ``pct`` percent of the routed-expert bytes."""
    return max(1, min(num_experts, round(pct / 100.0 * num_experts)))


@dataclass
class Run:
    """One replay of one system at one cache size on one trace."""

    trace: str
    system: str
    pct: float
    result: ReplayResult
    bound_hit_rate: float | None = None  # Belady MIN's hit rate (demand/bypass caching)
    bound_ratio: float | None = None  # the valid LP bound / fused residency at this size (sim/bounds/lp.py)
    bound_name: str = ""  # which MIN bound_hit_rate is (replay.hit_bound): MIN, MIN+bypass, global MIN+bypass
    min_ratio: float | None = None  # the old MIN bound / fused (sim/bounds/physical.py; CPU-served misses free: loose)

    @property
    def x_bound(self) -> float:
        """TPOT / the valid LP bound's."""
        return self.result.ratio_to_full / self.bound_ratio if self.bound_ratio else float("nan")


@dataclass
class TraceInfo:
    label: str
    path: str
    model: str
    block_length: int
    batch_size: int
    num_layers: int
    num_experts: int
    forwards: int
    output_tokens: int
    has_predictions: bool
    warmup: int = 0  # recorded sequences replayed untimed before counting starts
    timed_as: str = ""  # the model whose expert size times it (hardware.MODEL_SHAPES)
    runs: list[Run] = field(default_factory=list)
    tuned: dict[str, dict[str, Any]] = field(default_factory=dict)  # per system, the knobs its tuning chose
    profile: np.ndarray | None = None  # the dev profile of that tuning, where its shape is the trace's


def trace_info(label: str, path: str, trace: Trace) -> TraceInfo:
    h = trace.header
    return TraceInfo(label, path, str(h.get("model", "")), int(h.get("block_length", 0)), int(h.get("batch_size", 1)),
                     trace.num_layers, trace.num_experts, trace.num_forwards, trace.output_tokens(),
                     trace.has_predictions)


def dev_profile(trace: Trace) -> np.ndarray:
    """Tokens per layer and expert over a (dev) trace: kTransformers/Fiddler's offline popularity profile."""
    return request_counts(trace).sum(axis=1).astype(np.float64)


def resolve(spec: ReportSystem, knobs: dict[str, Any] | None, profile: np.ndarray | None) -> System:
    """The system a report row runs: its parts, its tuned knobs, a dev profile where it needs one."""
    system = spec.system(knobs)
    if spec.dev_profile and profile is not None:  # without a dev trace: profiled on its own warm-up
        system = system.with_knobs(retention__profile=profile)
    return system


def needs_predictions(system: System) -> bool:
    return system.prefetch in ("gate", "gate-capped")


def run_systems(trace: Trace, label: str, systems: Iterable[ReportSystem], pcts: Iterable[float], cost: CostModel,
                planner_s: float | None, bounds: bool = True, warmup_sequences: int = 0,
                tuned: dict[str, dict[str, Any]] | None = None, profile: np.ndarray | None = None,
                believed: CostModel | None = None, lp_window: int = 0, calibrate: bool = False) -> list[Run]:
    """Replay every system at every size; attach Belady's hit rate and the bounds per size.

    ``calibrate``: every system whose dispatch reads costs corrects ``believed`` online
    (``dispatch.calibrate=1``; ``report_calibration.calibrated``).

    ``lp_window`` > 0: the valid LP bound (``sim/bounds/lp.py``) in windows of that many forwards
    (``Run.bound_ratio``); 0 leaves it out. The old MIN bound (``Run.min_ratio``) comes with ``bounds``.

    The hit-rate ceiling is the MIN the run can reach (``replay.hit_bound``): demand MIN for uniform
    runs that copy every miss, MIN with bypass for uniform runs with CPU dispatch, global MIN with
    bypass for layer-adaptive ones. Reporting only: the plans are those of the systems.
    """
    runs: list[Run] = []
    tuned = tuned or {}
    for pct in pcts:
        size = slots_for(pct, trace.num_experts)
        cache: dict[tuple[bool, bool], tuple[float, str]] = {}
        total = size * trace.num_layers
        bound = lower_bound("min", trace, cost, total, warmup_sequences) if bounds else None
        lp = None
        if bounds and lp_window > 0:
            lp = lower_bound("lp", trace, cost, total, warmup_sequences, window_forwards=lp_window).ratio_to_full
        for spec in systems:
            system = resolve(spec, tuned.get(spec.name), profile)
            if needs_predictions(system) and not trace.has_predictions:
                continue
            if calibrate:
                system = calibrated(system)
            r = replay(trace, spec.name, size, system=system, cost_model=cost, planner_s=planner_s,
                       warmup_sequences=warmup_sequences, believed=believed)
            ceiling, ceiling_name = None, ""
            if bounds:
                key = (system.layer_adaptive, system.dispatch == "copy")
                if key not in cache:
                    b = hit_bound(trace, size, *key)
                    cache[key] = (b.hit_rate, b.name)
                ceiling, ceiling_name = cache[key]
            runs.append(Run(label, spec.name, pct, r, ceiling, lp, ceiling_name,
                            bound.ratio_to_full if bound else None))
    return runs


def tune(dev: Trace, systems: Iterable[ReportSystem], cost: CostModel, planner_s: float | None,
         warmup_sequences: int = 0, pcts: Iterable[float] = HEADLINE_PCT,
         profile: np.ndarray | None = None) -> dict[str, tuple[dict[str, Any], list[tuple[dict[str, Any], float]]]]:
    """Per system, the grid setting of lowest mean TPOT / fused over ``pcts`` on the dev trace.

    Returns ``{name: (chosen knobs, [(knobs, mean x fused) for every setting searched])}``.
    """
    return tune_many([(dev, cost, warmup_sequences)], systems, planner_s, pcts, profile)


def tune_many(devs: list[tuple[Trace, CostModel, int]], systems: Iterable[ReportSystem], planner_s: float | None,
              pcts: Iterable[float] = HEADLINE_PCT, profile: np.ndarray | None = None,
              ) -> dict[str, tuple[dict[str, Any], list[tuple[dict[str, Any], float]]]]:
    """:func:`tune` over several dev traces ``(trace, cost model, warm-up sequences)``: a setting's score is its
    mean x fused over every trace and size (a workload's dev seeds). A system that needs predicted routes is
    searched only if every dev trace has them."""
    pcts = tuple(pcts)
    out = {}
    for spec in systems:
        scores = []
        for knobs in spec.grid:
            system = resolve(spec, knobs, profile)
            if needs_predictions(system) and not all(dev.has_predictions for dev, _, _ in devs):
                break
            xs = [replay(dev, spec.name, slots_for(p, dev.num_experts), system=system, cost_model=cost,
                         planner_s=planner_s, warmup_sequences=warm).ratio_to_full
                  for dev, cost, warm in devs for p in pcts]
            scores.append((knobs, float(np.mean(xs))))
        if scores:
            out[spec.name] = (min(scores, key=lambda ks: ks[1])[0], scores)
    return out


def strongest_fair(runs: list[Run], pct: float, ours: str = OURS) -> Run | None:
    """The lowest-TPOT system other than ours at one size (every system tuned the same way)."""
    at = [r for r in runs if r.pct == pct and r.system != ours]
    return min(at, key=lambda r: r.result.tpot_s) if at else None


def ablation_systems(base: ReportSystem, tuned_knobs: dict[str, Any]) -> list[tuple[str, System]]:
    """(c): the strongest fair baseline, then one part changed at a time towards oled.

    base -> + confidence retention (oled's policy, the base's prefetch/dispatch/allocation) ->
    + layer-adaptive -> + reuse-aware compensation (dispatch cpu+reuse, oled's tuned knobs); for the
    credit of retention alone, lru with the last row's other parts; then the same steps with oled's
    dispatch (cpu+reuse) throughout, so that retention and allocation are measured on one dispatch.
    """
    b = parse_system(base.parts)
    b_knobs = {k: v for k, v in tuned_knobs.get(base.name, {}).items() if not k.startswith("retention.")}
    oled_knobs = tuned_knobs.get(OURS, {})
    s1 = System("oled", b.prefetch, b.dispatch, b.allocation)
    s2 = System("oled", b.prefetch, b.dispatch, "adaptive")
    s3 = System("oled", b.prefetch, "cpu+reuse", "adaptive")
    ref = System("lru", b.prefetch, "cpu+reuse", "adaptive")

    def k(system: System, knobs: dict[str, Any]) -> System:
        keep = {kk: v for kk, v in knobs.items()
                if not (kk.startswith("dispatch.") and system.dispatch != "cpu+reuse")}
        return system.with_knobs(**{kk.replace(".", "__", 1): v for kk, v in keep.items()})

    d0 = System(b.retention, b.prefetch, "cpu+reuse", b.allocation)
    d1 = System("oled", b.prefetch, "cpu+reuse", b.allocation)
    d2 = System("oled", b.prefetch, "cpu+reuse", "adaptive")
    both = {**b_knobs, **oled_knobs}
    oled_other = {kk: v for kk, v in oled_knobs.items() if not kk.startswith("retention.")}  # oled's, not its policy's
    return [(f"{base.name} (strongest fair baseline)", base.system(tuned_knobs.get(base.name))),
            ("+ confidence retention", k(s1, b_knobs)),
            ("+ layer-adaptive", k(s2, b_knobs)),
            ("+ reuse-aware compensation", k(s3, both)),
            ("(lru with the same parts as the last row)", k(ref, {**b_knobs, **oled_other})),
            (f"[on oled's dispatch] {base.name}'s retention", k(d0, {**tuned_knobs.get(base.name, {}), **oled_other})),
            ("[on oled's dispatch] + confidence retention", k(d1, both)),
            ("[on oled's dispatch] + layer-adaptive", k(d2, both))]


# ---------------------------------------------------------------------- tables
def md_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def pick(runs: list[Run], system: str, pct: float) -> Run | None:
    return next((r for r in runs if r.system == system and r.pct == pct), None)


def headline_table(runs: list[Run], systems: Iterable[str], pcts: Iterable[float] = HEADLINE_PCT) -> str:
    """x fused, x bound (valid LP) and U_slot (hit rate) of every system at the headline sizes, and the bounds."""
    pcts = list(pcts)
    head = (["system"] + [f"{p:g}%: x fused" for p in pcts] + [f"{p:g}%: x bound (LP)" for p in pcts]
            + [f"{p:g}%: U_slot (hit)" for p in pcts])
    rows = []
    for name in systems:
        got = [pick(runs, name, p) for p in pcts]
        if not any(got):
            continue
        rows.append([name] + [f"{g.result.ratio_to_full:.2f}" if g else "-" for g in got]
                    + [f"{g.x_bound:.2f}" if g and g.bound_ratio else "-" for g in got]
                    + [f"{g.result.u_slot:.2f} ({g.result.hit_rate:.2f})" if g else "-" for g in got])
    rows += bound_rows(runs, pcts, len(pcts))
    return md_table(head, rows)


LP_LABEL = "LP bound (valid)"
MIN_LABEL = "MIN bound (CPU-served misses enter free, loose)"


def bound_rows(runs: list[Run], pcts: list[float], extra: int) -> list[list[str]]:
    """The valid LP bound's row (x fused, then x bound 1.00) and the old MIN bound's (x fused, then its x bound)."""
    rows = []
    lp = [next((r.bound_ratio for r in runs if r.pct == p and r.bound_ratio), None) for p in pcts]
    mn = [next((r.min_ratio for r in runs if r.pct == p and r.min_ratio), None) for p in pcts]
    if any(lp):
        rows.append([LP_LABEL] + [f"{b:.2f}" if b else "-" for b in lp] + ["1.00" if b else "-" for b in lp]
                    + ["-"] * extra)
    if any(mn):
        rows.append([MIN_LABEL] + [f"{b:.2f}" if b else "-" for b in mn]
                    + [f"{m / b:.2f}" if m and b else "-" for m, b in zip(mn, lp)] + ["-"] * extra)
    return rows


def margin_lines(runs: list[Run], pcts: Iterable[float] = HEADLINE_PCT, ours: str = OURS) -> list[str]:
    """oled against the strongest fair system, and its distance to the bound, per size."""
    lines = []
    for pct in pcts:
        mine, best = pick(runs, ours, pct), strongest_fair(runs, pct, ours)
        if mine is None or best is None:
            continue
        ratio = best.result.tpot_s / mine.result.tpot_s
        verdict = "oled faster" if ratio > 1 else "oled slower" if ratio < 1 else "tie"
        note = " (lead under 5%)" if 1 < ratio < 1.05 else ""
        dist = f"{mine.x_bound:.2f}x the valid LP bound" if mine.bound_ratio else "no LP bound computed"
        lines.append(f"- {pct:g}%: oled {mine.result.ratio_to_full:.2f}x fused, {dist}; strongest "
                     f"fair system {best.system} {best.result.ratio_to_full:.2f}x fused -> {best.system} / oled = "
                     f"{ratio:.3f} ({verdict}{note})")
    return lines


def detail_table(runs: list[Run]) -> str:
    """Every run: ratios, hit rate and its Belady gap, utilization, prefetch bytes, exposed copy, planner."""
    head = ["system", "cache %", "slots", "TPOT ms", "x fused", "x loop", "hit", "hit/MIN", "MIN", "U_slot",
            "copies used", "GiB copied", "pf issued/used/wasted GiB", "exposed ms/tok", "planner ms/fwd"]
    rows = []
    for run in runs:
        r = run.result
        gib = r.expert_bytes / 2**30
        n = max(r.output_tokens, 1)
        gap = f"{r.hit_rate / run.bound_hit_rate:.2f}" if run.bound_hit_rate else "-"
        pf = (f"{r.prefetch_issued * gib:.2f}/{r.prefetch_used * gib:.2f}/{r.prefetch_wasted * gib:.2f}"
              if r.prefetch_issued else "-")
        rows.append([run.system, f"{run.pct:g}", f"{r.cache_size:g}", f"{1e3 * r.tpot_s:.3f}",
                     f"{r.ratio_to_full:.2f}", f"{r.ratio_to_loop:.2f}", f"{r.hit_rate:.3f}", gap,
                     run.bound_name or "-", f"{r.u_slot:.3f}", f"{r.copies_used:.2f}",
                     f"{r.bytes_copied / 2**30:.2f}", pf,
                     f"{1e3 * r.exposed_copy_s / n:.3f}", f"{1e3 * r.planner_per_forward_s:.3f}"])
    names = sorted({run.bound_name for run in runs if run.bound_name})
    note = ("\n\n" + "\n".join(f"- {line.strip()}" for line in min_footnote(names, "hit/MIN").splitlines())
            if names else "")
    return md_table(head, rows) + note


def sweep_table(rows_by_key: dict[str, list[Run]], systems: Iterable[str], pcts: Iterable[float],
                key_name: str) -> str:
    """x fused per (setting, system) across cache sizes."""
    pcts = list(pcts)
    head = [key_name, "system"] + [f"{p:g}%" for p in pcts]
    rows = []
    for key, runs in rows_by_key.items():
        for name in systems:
            got = [pick(runs, name, p) for p in pcts]
            if any(got):
                rows.append([key, name] + [f"{g.result.ratio_to_full:.2f}" if g else "-" for g in got])
        for row in bound_rows(runs, pcts, 0):
            rows.append([key, row[0]] + row[1:1 + len(pcts)])
    return md_table(head, rows)


def groups(infos: list[TraceInfo], vary: Callable[[TraceInfo], int],
           same: Callable[[TraceInfo], tuple]) -> list[list[TraceInfo]]:
    """Traces that share ``same`` and differ in ``vary``; only groups with >= 2 distinct values."""
    by: dict[tuple, list[TraceInfo]] = {}
    for info in infos:
        by.setdefault(same(info), []).append(info)
    out = []
    for members in by.values():
        if len({vary(m) for m in members}) >= 2:
            out.append(sorted(members, key=vary))
    return out


def family(info: TraceInfo) -> str:
    """The trace's model family: its file label without the block/batch suffixes."""
    return info.label.split("-b")[0]


# the project's targets: TPOT ratios other / oled at 15, 25 and 40%, and oled / the valid bound at 40%
# our other compositions of the same parts; every other system is published
COMPOSED = ("lru-full", "lfu-full", "adaptive", "learned")
TARGET_COMPOSED, TARGET_PUBLISHED, TARGET_BOUND = 1.10, 1.25, 1.25


def _margin(mine: Run, runs: list[Run], pct: float, names: Iterable[str], target: float, what: str) -> str | None:
    at = [r for r in runs if r.pct == pct and r.system in set(names)]
    if not at:
        return None
    best = min(at, key=lambda r: r.result.tpot_s)
    ratio = best.result.tpot_s / mine.result.tpot_s
    verdict = "MET" if ratio >= target else f"MISSED by {target / ratio:.3f}x"
    return f"{ratio:.3f}x over the strongest {what} ({best.system}; target {target:.2f}x): {verdict}"


def targets(runs: list[Run]) -> list[str]:
    """The project's targets on one trace: oled's TPOT at least 1.10x lower than every other composition of the
    project's parts and 1.25x lower than the best published system at each headline size, and at most 1.25x the
    valid bound at 40% (where a bound was computed)."""
    lines = []
    names = {r.system for r in runs}
    published = names - set(COMPOSED) - {OURS}
    for pct in HEADLINE_PCT:
        mine = pick(runs, OURS, pct)
        if mine is None:
            continue
        parts = [m for m in (_margin(mine, runs, pct, COMPOSED, TARGET_COMPOSED, "composition"),
                             _margin(mine, runs, pct, published, TARGET_PUBLISHED, "published system")) if m]
        if pct == 40 and mine.bound_ratio:
            x = mine.x_bound
            parts.append(f"{x:.2f}x the valid LP bound (target at most {TARGET_BOUND:.2f}x): "
                         + ("MET" if x <= TARGET_BOUND else f"MISSED by {x / TARGET_BOUND:.2f}x"))
        if parts:
            lines.append(f"- {pct:g}%: oled " + "; ".join(parts))
    return lines


def write_markdown(path: Path, sections: list[str]) -> None:
    """Written whole or not at all: a temporary file in the target folder, then renamed over ``path``."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text("\n\n".join(sections) + "\n")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
