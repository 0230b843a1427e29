"""Offload parity on the toy task: accuracy and every answer identical with and without offloading.

The reference is the fully resident model through lm-eval's ``toy_addition`` (block-diffusion
``generate_until``, exact match); each (policy, cache budget) pair loads the checkpoint again with
an ``OffloadConfig`` and runs the same problems. A row passes when every generated answer string
equals the reference's (hence the accuracy too). The hit rate is the expert cache's over the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..offload.config import KNOWN_POLICIES
from ..offload.system import spelling, system_of_legacy
from ..toy.long.tasks import SHIPPED_TASKS

TASK = "toy_addition"
# The long-answer toy's tasks (eval/tasks/long_answer) and the budgets its parity check uses.
LONG_TASKS = tuple(f"long_{name}" for name in SHIPPED_TASKS)
LONG_BUDGETS = (("cache_ratio", 0.1), ("cache_ratio", 0.4))
METRIC = "exact_match,none"
DEFAULT_BUDGETS = (("cache_ratio", 0.4), ("cache_size", 1))
POLICIES = tuple(p for p in ("oled", "lru", "lfu", "static", "tide") if p in KNOWN_POLICIES)


@dataclass
class ParityRow:
    policy: str
    cache: str
    accuracy: float
    identical: bool
    hit_rate: float | None
    mismatches: int = 0


@dataclass
class ToyRun:
    accuracy: float
    answers: list[str]
    hit_rate: float | None


def budget_label(key: str, value) -> str:
    return f"{value:.0%} of expert bytes" if key == "cache_ratio" else f"{value} slot(s)/layer"


def run_toy(model: str, offload: dict | None = None, *, limit: int | None = None, batch_size: int = 32,
            data_files: dict | None = None, extra_args: dict | None = None, tasks: tuple[str, ...] = (TASK,)) -> ToyRun:
    """One lm-eval run over ``tasks``; answers in task order, accuracy pooled over all problems."""
    from .runner import evaluate, make_lm

    args = {**(extra_args or {}), **(offload or {})}
    lm = make_lm(model, args, batch_size=batch_size)
    results = evaluate(lm, list(tasks), limit=limit, log_samples=True, data_files=data_files, bootstrap_iters=0)
    answers: list[str] = []
    correct = 0.0
    for task in tasks:
        samples = sorted(results["samples"][task], key=lambda s: s["doc_id"])
        answers += [s["filtered_resps"][0] for s in samples]
        correct += float(results["results"][task][METRIC]) * len(samples)
    stats = results["config"].get("offload")
    return ToyRun(
        accuracy=correct / max(1, len(answers)),
        answers=answers,
        hit_rate=stats["total"]["hit_rate"] if stats else None,
    )


def run_parity(model: str, *, policies=POLICIES, budgets=DEFAULT_BUDGETS, limit: int | None = None,
               batch_size: int = 32, data_files: dict | None = None, extra_args: dict | None = None,
               echo=None, tasks: tuple[str, ...] = (TASK,)) -> tuple[ToyRun, list[ParityRow]]:
    """The resident reference and one row per (budget, policy), over ``tasks`` (lm-eval names)."""
    common = dict(limit=limit, batch_size=batch_size, data_files=data_files, extra_args=extra_args, tasks=tasks)
    reference = run_toy(model, **common)
    if echo:
        echo(f"resident: accuracy {reference.accuracy:.4f} on {len(reference.answers)} problems")
    rows = []
    for key, value in budgets:
        for policy in policies:
            run = run_toy(model, {key: value, "system": spelling(system_of_legacy(policy))}, **common)
            mismatches = sum(a != b for a, b in zip(run.answers, reference.answers))
            mismatches += abs(len(run.answers) - len(reference.answers))
            row = ParityRow(policy, budget_label(key, value), run.accuracy, mismatches == 0, run.hit_rate, mismatches)
            rows.append(row)
            if echo:
                echo(format_row(row))
    return reference, rows


HEADER = f"{'policy':<8} {'cache':<22} {'accuracy':>9} {'answers identical':>18} {'hit rate':>9}"


def format_row(row: ParityRow) -> str:
    same = "yes" if row.identical else f"NO ({row.mismatches})"
    hit = "-" if row.hit_rate is None else f"{row.hit_rate:.3f}"
    return f"{row.policy:<8} {row.cache:<22} {row.accuracy:>9.4f} {same:>18} {hit:>9}"


def format_table(reference: ToyRun, rows: list[ParityRow]) -> str:
    lines = [HEADER, "-" * len(HEADER),
             format_row(ParityRow("-", "resident (reference)", reference.accuracy, True, None))]
    lines += [format_row(r) for r in rows]
    return "\n".join(lines)


def full_split_files(out_dir: Path) -> dict:
    """Write the complete held-out split (and the default train file) and return lm-eval ``data_files``."""
    from .tasks import TOY_DATA_SIZES, heldout_size, write_toy_data

    paths = write_toy_data(out_dir, n_train=TOY_DATA_SIZES["n_train"], n_heldout=heldout_size())
    return {"train": str(paths["train"]), "test": str(paths["test"])}
