"""What every long-answer task shares: the problem record, the split by key hash, labels and digit words.

In its own module so that ``tasks.py`` (the labelled, one-answer tasks) and ``open_tasks.py`` (the
tasks with many right answers) build on the same split without importing each other in a cycle.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

HELDOUT_MODULUS = 16  # 1 key in 16 is held out
SPLIT_SALT = b"oled-hf-long-tasks-v1"
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
LABELS = "ABCDEFGHIJKLMNOP"  # item labels of the labelled tasks (uppercase: never a letter of a spelled word)


@dataclass(frozen=True)
class Problem:
    """One question/answer pair; ``key`` is what the split hashes (``task:key``).

    For a task with many right answers ``answer`` is one of them, drawn at random: the training
    target and the lm-eval reference, while accuracy asks the task's checker.
    """

    task: str
    key: str
    question: str
    answer: str


def key_is_heldout(task: str, key: str) -> bool:
    """True for the ~1/HELDOUT_MODULUS keys of ``task`` that belong to the held-out split."""
    digest = hashlib.blake2b(f"{task}:{key}".encode(), digest_size=8, key=SPLIT_SALT).digest()
    return int.from_bytes(digest, "little") % HELDOUT_MODULUS == 0
