"""The paper-style evaluation of recorded traces: every system, every sweep, one markdown report.

``oled-moe report TRACE... --out DIR`` replays each trace through every system below, timed as the
chosen model on H200 + PCIe 5 (``oled_hf.sim.hardware``), and writes ``report.md`` plus PNG plots:

(a) TPOT (ratio to the fused-resident reference) and cache utilization vs cache size (10-100%);
(b) gap to the ideal: hit rate / Belady MIN (demand/bypass caching bound) and TPOT / fused residency;
(c) ablation lru -> +confidence retention -> +layer-adaptive -> +cooperative compensation;
(d) block length x cache size and (e) batch size, from traces that differ only in that setting
    (read from the trace headers; the report says when no such group exists);
(f) PCIe 16/32/64 GB/s; (g) planner/policy host time per forward.

Utilization (peers.md section 3): ``U_slot`` = hits / (slots x layer accesses), the mean fraction of
cached experts a layer access uses; ``copies used`` = fraction of copied experts hit again before
eviction (1 - dead-on-arrival / evictions). Everything here is pure data plus formatting; the plots
live in ``plots.py`` and the command in ``oled_hf/cli/report.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from oled_hf.offload.costmodel import CostModel

from .belady import belady_global, belady_min
from .replay import ReplayResult, replay
from .trace import Trace

SIZES_PCT = (10, 15, 25, 40, 60, 100)
HEADLINE_PCT = (15, 25, 40)
PCIE_GBPS = (16, 32, 64)


@dataclass(frozen=True)
class System:
    """One offloading system: a policy with its allocation and miss dispatch, as the system runs it."""

    name: str
    policy: str
    layer_adaptive: bool
    cpu_compute: str
    models: str  # which published system this row stands for


SYSTEMS = (
    System("oled", "oled", True, "auto", "OLED-MoE (this project): confidence retention, layer-adaptive, CPU-GPU"),
    System("lru", "lru", False, "off", "mixtral-offloading: per-layer LRU, misses copied"),
    System("lfu", "lfu", False, "off", "per-layer LFU, misses copied"),
    System("static", "static", False, "auto", "kTransformers / Fiddler: static popularity placement, misses on CPU"),
    System("tide", "tide", False, "auto", "TIDE: top-by-tokens refresh every tau iterations, misses on CPU"),
    System("prefetch", "prefetch", False, "off",
           "Mixtral-offloading / Pre-gated MoE / ProMoE / HybriMoE: next-layer gate prefetch, LRU"),
    System("moe-infinity", "moe-infinity", False, "off", "MoE-Infinity: activation-matrix prefetch, priority eviction"),
)
ABLATION = (
    System("lru", "lru", False, "off", "baseline"),
    System("+confidence retention", "oled", False, "off", "oled policy, uniform split, misses copied"),
    System("+layer-adaptive", "oled", True, "off", "oled policy, adaptive split, misses copied"),
    System("+cooperative compensation", "oled", True, "auto", "the full method"),
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
    bound_hit_rate: float | None = None


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
    runs: list[Run] = field(default_factory=list)


def trace_info(label: str, path: str, trace: Trace) -> TraceInfo:
    h = trace.header
    return TraceInfo(label, path, str(h.get("model", "")), int(h.get("block_length", 0)), int(h.get("batch_size", 1)),
                     trace.num_layers, trace.num_experts, trace.num_forwards, trace.output_tokens(),
                     trace.has_predictions)


def run_systems(trace: Trace, label: str, systems: Iterable[System], pcts: Iterable[float], cost: CostModel,
                planner_s: float | None, bounds: bool = True, warmup_sequences: int = 0) -> list[Run]:
    """Replay every system at every size; attach the Belady bound that matches each run's split."""
    runs: list[Run] = []
    for pct in pcts:
        size = slots_for(pct, trace.num_experts)
        cache: dict[bool, float] = {}
        for s in systems:
            if s.policy == "prefetch" and not trace.has_predictions:
                continue
            r = replay(trace, s.policy, size, layer_adaptive=s.layer_adaptive, cpu_compute=s.cpu_compute,
                       cost_model=cost, planner_s=planner_s, warmup_sequences=warmup_sequences)
            bound = None
            if bounds:
                if s.layer_adaptive not in cache:
                    total = size * trace.num_layers
                    cache[s.layer_adaptive] = (belady_global(trace, total) if s.layer_adaptive
                                               else belady_min(trace, size)).hit_rate
                bound = cache[s.layer_adaptive]
            runs.append(Run(label, s.name, pct, r, bound))
    return runs


# ---------------------------------------------------------------------- tables
def md_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def pick(runs: list[Run], system: str, pct: float) -> Run | None:
    return next((r for r in runs if r.system == system and r.pct == pct), None)


def headline_table(runs: list[Run], systems: Iterable[str], pcts: Iterable[float] = HEADLINE_PCT) -> str:
    """TPOT / fused residency and U_slot (hit rate) for every system at the headline sizes."""
    pcts = list(pcts)
    head = ["system"] + [f"{p:g}%: x fused" for p in pcts] + [f"{p:g}%: U_slot (hit)" for p in pcts]
    rows = []
    for name in systems:
        got = [pick(runs, name, p) for p in pcts]
        if not any(got):
            continue
        rows.append([name] + [f"{g.result.ratio_to_full:.2f}" if g else "-" for g in got]
                    + [f"{g.result.u_slot:.2f} ({g.result.hit_rate:.2f})" if g else "-" for g in got])
    return md_table(head, rows)


def detail_table(runs: list[Run]) -> str:
    """Every run: ratios, hit rate and its Belady gap, utilization, prefetch bytes, exposed copy, planner."""
    head = ["system", "cache %", "slots", "TPOT ms", "x fused", "x loop", "hit", "hit/MIN", "U_slot", "copies used",
            "GiB copied", "pf issued/used/wasted GiB", "exposed ms/tok", "planner ms/fwd"]
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
                     f"{r.u_slot:.3f}", f"{r.copies_used:.2f}", f"{r.bytes_copied / 2**30:.2f}", pf,
                     f"{1e3 * r.exposed_copy_s / n:.3f}", f"{1e3 * r.planner_per_forward_s:.3f}"])
    return md_table(head, rows)


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


def targets(runs: list[Run], prefetchers: Iterable[str] = ("prefetch", "moe-infinity")) -> list[str]:
    """Deliverable-5 checks on one trace: lowest TPOT at 15/25/40%, >= 1.23x vs best prefetcher, <= 1.25x fused."""
    lines = []
    for pct in HEADLINE_PCT:
        at = [r for r in runs if r.pct == pct]
        oled = pick(at, "oled", pct)
        if oled is None or len(at) < 2:
            continue
        best = min((r for r in at if r.system != "oled"), key=lambda r: r.result.tpot_s)
        win = oled.result.tpot_s <= best.result.tpot_s
        lines.append(f"- {pct:g}%: oled {oled.result.ratio_to_full:.2f}x fused; best other {best.system} "
                     f"{best.result.ratio_to_full:.2f}x -> lowest: {'MET' if win else 'MISSED'} "
                     f"(oled / best = {oled.result.tpot_s / best.result.tpot_s:.2f})")
        if pct == 40:
            pf = [r for r in at if r.system in prefetchers]
            if pf:
                bp = min(pf, key=lambda r: r.result.tpot_s)
                gain = bp.result.tpot_s / oled.result.tpot_s
                lines.append(f"- 40%: best prefetcher {bp.system} / oled = {gain:.2f} (target >= 1.23): "
                             f"{'MET' if gain >= 1.23 else 'MISSED'}")
            ok = oled.result.ratio_to_full <= 1.25
            lines.append(f"- 40%: oled / fused = {oled.result.ratio_to_full:.2f} (target <= 1.25): "
                         f"{'MET' if ok else 'MISSED'}")
    return lines


def write_markdown(path: Path, sections: list[str]) -> None:
    path.write_text("\n\n".join(sections) + "\n")
