"""What ``oled-moe demo`` shows, as pure functions: which tasks to ask, the tables, the projection.

Kept apart from the command so each piece is testable without a model: the prompts are held-out
questions of the tasks the checkpoint's own report says it solves (a demo of wrong answers makes
no case), the memory, live and timing figures are table rows, and the projection replays the
demo's own routing with the public replay functions (``oled_hf.sim``), never a timing of its own.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

SOLVED_AT = 0.8  # held-out exact match from which a task counts as solved (spell_labeled: 0.83)
AS_MODEL = "llada2.0-mini"  # the report's timing: this model's expert size on H200 + PCIe 5
PLANNER_S = 20e-6  # host planner per layer access, as the report states it (a measured one would be noisy)
SYSTEMS = ("oled", "lru-full")  # ours and the strongest fair baseline (LRU, the same dispatch and allocation)
# the setting the report's tuning on its dev split chose for both systems (eval/report/report.md)
REPORT_KNOBS = {"dispatch__reuse_copies": 1}


def heldout_entry(report: dict, block_length: int | None, threshold: float | None) -> dict | None:
    """The held-out evaluation of ``report`` (``long_report.json``) at the demo's decoding, else its first one."""
    results = (report.get("heldout") or {}).get("results") or []
    for entry in results:
        if entry.get("block_length") == block_length and entry.get("threshold") == threshold:
            return entry
    return results[0] if results else None


def solved_tasks(entry: dict, solved_at: float = SOLVED_AT) -> tuple[list[str], dict[str, float]]:
    """``(solved task names, {unsolved name: accuracy})`` of one held-out evaluation, in its order.

    Accuracy is the checker's pass rate for a task with many right answers (its exact match against
    the one reference drawn is no score), exact match otherwise (reports before checkers: exact match)."""
    solved, unsolved = [], {}
    for task in entry.get("tasks", []):
        name, em = task["task"], float(task.get("accuracy", task["exact_match"]))
        if em >= solved_at:
            solved.append(name)
        else:
            unsolved[name] = em
    return solved, unsolved


def left_out_line(unsolved: dict[str, float], entry: dict, source: str, solved_at: float = SOLVED_AT) -> str:
    """One line: which tasks the demo does not ask, and why (this toy does not solve them)."""
    tasks = ", ".join(f"{name} ({em:.0%} exact match)" for name, em in unsolved.items())
    n = entry.get("tasks", [{}])[0].get("n", "?")
    return (f"left out: {tasks}: unsolved by this toy (below {solved_at:.0%} exact match on {n} held-out "
            f"questions at block {entry.get('block_length')}, threshold {entry.get('threshold')}; {source})")


def check_mark(prompt: str, answer: str) -> str:
    """``(right)`` / ``(wrong)`` where a checker knows the task (the toys' addition, the long tasks), else ""."""
    from ..toy.long.tasks import check_answer

    m = re.fullmatch(r"What is (\d+)\+(\d+)\?", prompt.strip())
    ok = answer.strip() == str(int(m.group(1)) + int(m.group(2))) if m else check_answer(prompt.strip(), answer)
    return "" if ok is None else "  (right)" if ok else "  (wrong)"


def routed_expert_bytes(model) -> int:
    """Bytes of every routed expert's weights in a resident model (shared experts excluded: never offloaded)."""
    pattern = re.compile(r"\.mlp\.experts\.\d+\.")
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters() if pattern.search(n))


def mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def table(rows: list[list[str]]) -> str:
    """Rows as aligned text columns: the first left-aligned, the others right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in rows)


TERMS = (  # the demo's words for a newcomer, printed under the budget line
    "terms: a slot holds one routed expert's weights on the device; a hit: an expert a token needs is in a slot;\n"
    "  a miss is copied from the host store (bytes copied) or run on the CPU (CPU expert-tokens); x fused: time per\n"
    "  token over the time with every expert resident; physical bound: the least time any cache could take here"
)


def slot_range(capacities: list[int]) -> str:
    """Whole slots per layer: ``102`` when every layer has as many, else ``102-103`` (never a mean like 102.3)."""
    low, high = min(capacities), max(capacities)
    return str(low) if low == high else f"{low}-{high}"


def even_split(total_slots: int, num_layers: int) -> list[int]:
    """``total_slots`` dealt over ``num_layers`` as evenly as whole slots go (the first layers get one more)."""
    base, extra = divmod(int(total_slots), int(num_layers))
    return [base + (i < extra) for i in range(num_layers)]


def budget_line(asked: str, stats: dict, num_experts: int) -> str:
    """The budget as asked (``cache ratio 0.4``: ``budget.budget_name``) in whole slots: per layer
    (range), in all, and as a share of every routed expert.

    With the ``adaptive`` allocation (oled's and lru-full's) slots then move between layers, so
    the live table's row, read after the first pass, may show a wider range; the line says so.
    """
    capacities = [int(layer["capacity"]) for layer in stats["layers"]]
    share = stats["total_slots"] / (len(capacities) * num_experts)
    moves = stats.get("system", "").endswith("+adaptive")
    return (f"budget: {asked}: {slot_range(capacities)} expert slots per MoE layer of its "
            f"{num_experts} experts ({stats['total_slots']} slots over {len(capacities)} MoE layers, {share:.1%})"
            + ("; the allocation then moves slots to the layers that miss most" if moves else ""))


def memory_table(resident_bytes: int, stats: dict) -> str:
    """Device expert bytes resident vs offloaded, and the host store only offloading needs."""
    share = stats["pool_bytes"] / resident_bytes if resident_bytes else float("nan")
    return table([
        [f"memory (device: {stats['device']})", "resident", "offloaded"],
        ["device: routed-expert bytes", mib(resident_bytes), f"{mib(stats['pool_bytes'])} ({share:.0%})"],
        ["host: expert store", "-", f"{mib(stats['host_bytes'])} ({stats['store']})"],
    ])


@dataclass
class Live:
    """One system's model and what its runs gave: seconds and new tokens per timed run, tokens matched."""

    name: str
    model: Any
    seconds: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    identical: bool = True
    stats: dict | None = None  # offload_stats() after the counted first pass (None: resident)

    def ms_per_token(self) -> list[float]:
        return [1e3 * s / max(t, 1) for s, t in zip(self.seconds, self.tokens)]


def live_table(systems: list[Live], n_prompts: int, warmup_runs: int = 1) -> str:
    """Per system: slots, hit rate, bytes copied, CPU expert-tokens, identical tokens, ms per token."""
    runs = len(systems[0].seconds)

    def cell(s: Live, key: str) -> str:
        if s.stats is None:
            return "-"
        total = s.stats["total"]
        capacities = [int(layer["capacity"]) for layer in s.stats["layers"]]
        return {"slots": slot_range(capacities), "hit": f"{total['hit_rate']:.3f}",
                "bytes": mib(total["bytes_copied"]), "cpu": str(total["cpu_expert_tokens"])}[key]

    def timing(s: Live) -> str:
        ms = s.ms_per_token()
        return f"{statistics.median(ms):.2f} ({min(ms):.2f}-{max(ms):.2f})" if ms else "-"

    rows = [["live, this machine", *(s.name for s in systems)],
            ["expert slots per MoE layer (end of first pass)",
             *(cell(s, "slots") if s.stats else "all" for s in systems)],
            ["hit rate (first pass)", *(cell(s, "hit") for s in systems)],
            ["bytes copied (first pass)", *(cell(s, "bytes") for s in systems)],
            ["CPU expert-tokens (first pass)", *(cell(s, "cpu") for s in systems)],
            ["tokens identical to resident", *("-" if s.stats is None else "yes" if s.identical else "NO"
                                               for s in systems)],
            [f"ms per token, median (min-max) of {runs}", *(timing(s) for s in systems)]]
    return table(rows) + (f"\n  times: {runs} run(s) over {n_prompts} prompt(s) after {warmup_runs} untimed warm-up "
                          "run(s), round-robin (per prompt the systems take turns,\n  the order rotating); median and "
                          "range of the per-run ms per token")


def noise_line(systems: list[Live], load: tuple[float, float] | None, cores: int) -> str:
    """How far the live times can be trusted: the systems' own run-to-run spread, and the machine's load.

    Why: on a shared 2-core machine a busy neighbour made oled look 2x slower than lru-full in one
    run and faster in the next; the table alone did not say that its differences were noise.
    """
    spreads = [max(ms) / min(ms) - 1 for ms in (s.ms_per_token() for s in systems) if len(ms) > 1 and min(ms) > 0]
    if spreads:
        worst = max(spreads)
        text = (f"  noise: run to run, a system's ms per token varied by up to {worst:.0%} here; differences between "
                "systems smaller than that are noise")
    else:
        text = "  noise: one timed run, so no spread was measured (without --quick the demo times 3 and shows it)"
    if load is not None:
        busy = max(load) > 0.5 * cores
        text += (f"\n  load average {load[0]:.1f} when the timing started, {load[1]:.1f} when it ended, on {cores} "
                 f"cores{': a busy machine, so these times say little' if busy else ''}")
    return text


def projection(trace, total_slots: int, systems: tuple[str, ...] = SYSTEMS) -> str:
    """This run's routing replayed as LLaDA2.0-mini on H200 + PCIe 5: TPOT and x fused residency.

    The first recorded sequence (the demo's warm-up) warms the simulated cache, as it warmed the
    live one; the timing and the bound are ``oled_hf.sim``'s (``replay``, ``bounds.lower_bound``).
    """
    from ..offload.config import OffloadConfig
    from ..offload.system import parse_system
    from ..sim.bounds import lower_bound
    from ..sim.hardware import cost_model_from_args
    from ..sim.replay import replay

    cm = cost_model_from_args(trace, SimpleNamespace(as_model=AS_MODEL))
    L, E = trace.num_layers, trace.num_experts
    budget = OffloadConfig(cache_ratio=total_slots / (L * E))  # the live budget, in whole slots
    warm = 1 if len(set(trace.arrays["fwd_seq"].tolist())) > 1 else 0
    results = [replay(trace, name, None, system=parse_system(name).with_knobs(**REPORT_KNOBS),
                      offload_config=budget, cost_model=cm, planner_s=PLANNER_S, warmup_sequences=warm)
               for name in systems]
    bound = lower_bound("min", trace, cm, total_slots, warm).ratio_to_full
    fused_ms, slots = 1e3 * results[0].full_tpot_s, slot_range(even_split(total_slots, L))
    rows = [["system", "slots/layer at start", "hit rate", "TPOT ms", "x fused"]]
    rows += [[r.policy, slots, f"{r.hit_rate:.3f}", f"{1e3 * r.tpot_s:.3f}", f"{r.ratio_to_full:.2f}"]
             for r in results]
    rows.append(["physical bound", slots, "-", f"{fused_ms * bound:.3f}", f"{bound:.2f}"])
    rows.append(["fused residency", "all", "1.000", f"{fused_ms:.3f}", "1.00"])
    head = (f"projection (simulated, not measured): this run's routing ({L} MoE layers) timed as "
            f"LLaDA2.0-mini on H200 + PCIe 5")
    notes = [f"  expert {mib(cm.expert_bytes)}, H2D {cm.h2d_bytes_per_s / 1e9:g} GB/s, planner "
             f"{PLANNER_S * 1e6:g} us per layer access; TPOT = time per output token; the simulated machine has an",
             "  accelerator, so misses may run on its CPU and hit rates differ from the live rows; both systems also "
             "copy, per layer",
             "  access, 1 CPU-run miss they expect to need again (reuse_copies=1, the report's tuned setting); "
             "bound: oled_hf/sim/bounds/physical.py"]
    return "\n".join([head, table(rows), *notes])


def report_source(path: Path) -> str:
    """How the left-out line names the report it read."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
