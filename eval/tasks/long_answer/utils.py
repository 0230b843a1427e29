"""Scoring and data loading of the long-answer toy's lm-eval tasks.

Every task reports ``exact_match`` (the answer equals the reference, the one-answer tasks' score)
and ``accuracy``: for a task with many right answers (``climb``, ``pick``, ``vary``) the checker
of ``oled_hf.toy.long.open_tasks`` on the question, since the reference is only one valid answer
drawn at random; for the one-answer tasks the same exact match.
"""

from __future__ import annotations


def score(doc: dict, answer: str) -> dict[str, float]:
    """Both metrics of one generated ``answer`` to ``doc`` (a JSONL row: task, question, answer)."""
    from oled_hf.toy.long.open_tasks import OPEN_TASKS, check_open

    exact = answer == doc["answer"]
    passed = check_open(doc["task"], doc["question"], answer) if doc["task"] in OPEN_TASKS else exact
    return {"exact_match": float(exact), "accuracy": float(passed)}


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """lm-eval's hook for ``generate_until``: ``results`` holds the one generated string."""
    return score(doc, results[0])


def load_dataset(data_files: dict | None = None, **_metadata):
    """The task's JSON splits, with relative ``data_files`` read next to this file, not the working directory."""
    from pathlib import Path

    import datasets

    if not data_files:
        raise ValueError("long_answer tasks: dataset_kwargs.data_files must name the train and test JSONL files")
    here = Path(__file__).resolve().parent
    resolved = {split: str(path if Path(path).is_absolute() else here / path) for split, path in data_files.items()}
    return datasets.load_dataset("json", data_files=resolved)
