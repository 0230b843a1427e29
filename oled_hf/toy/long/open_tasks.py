"""Long-answer tasks with many right answers: a checker validates an answer instead of matching one.

In the labelled one-answer tasks of ``tasks.py`` every answer token is determined by the question,
so a trained model is confident everywhere and decodes a 16-token block in ~1.5 iterations at
threshold 0.95. Real text hesitates because several continuations are valid; these tasks give the
toy that kind of choice. Each question fixes a constraint, the training target is one valid answer
drawn at random per example (so the model learns the spread of valid answers, not one of them),
and accuracy is the checker's pass rate. Items carry the labels ``A, B, C, ...`` so the model
knows by content where it is and where to stop (the question names the last label), the trick
that made the one-answer tasks learnable (``tasks.py``).

* ``climb``: ``Count to L from 047 by 1-3`` -> ``A047B049C052...``: items ``A`` to ``L``, the
  first the start, each next one 1 to 3 more than the one before, three digits each
  (size: items, 7-12, answers 28-48 tokens). A chain: each choice moves every later term.
* ``pick``: ``Spell to F from 147`` -> ``A four B seven C one D one E four F seven``: a digit of the
  given set for each label, spelled letter by letter (size: items, 5-7; sets of 2-5 digits shown
  in random order). Independent choices, each made in a word's first letters.
* ``vary``: ``Vary to P from 1357`` -> ``A3B1C3D5...``: a digit of the set for each label, never
  the same digit twice in a row (size: items, 12-16; sets of 3-6 digits). Every digit is a choice
  constrained by its neighbours.

The split is by key as in ``tasks.py`` (``problem.key_is_heldout``); the key is the constraint
(start and count; set and count), never the drawn answer, so a held-out constraint is never
trained on with any answer. :func:`check_open` takes the question and an answer; it needs no
reference answer, which is how lm-eval scores these tasks (``eval/tasks/long_answer/utils.py``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

from .problem import LABELS, WORDS, Problem

CLIMB_STEPS = (1, 2, 3)
CLIMB_MAX = 999  # three-digit terms


def _check_size(task: str, size: int, lo: int) -> None:
    if not lo <= size <= len(LABELS):
        raise ValueError(f"{task}: {lo} to {len(LABELS)} items (labels A-P), got {size}")


def _digit_set(rng: random.Random, lo: int, hi: int) -> tuple[str, str]:
    """A random set of ``lo``-``hi`` distinct digits: (sorted, for the key; shuffled, for the question)."""
    digits = rng.sample("0123456789", rng.randint(lo, hi))
    return "".join(sorted(digits)), "".join(digits)


def make_climb(rng: random.Random, size: int) -> Problem:
    """``Count to L from 047 by 1-3`` -> ``A047B049C052...`` (one valid answer, steps drawn uniformly)."""
    _check_size("climb", size, 2)
    start = rng.randint(0, CLIMB_MAX - max(CLIMB_STEPS) * (size - 1))
    terms = [start]
    for _ in range(size - 1):
        terms.append(terms[-1] + rng.choice(CLIMB_STEPS))
    answer = "".join(f"{LABELS[i]}{t:03d}" for i, t in enumerate(terms))
    return Problem("climb", f"{start}/{size}", f"Count to {LABELS[size - 1]} from {start:03d} by 1-3", answer)


def make_pick(rng: random.Random, size: int) -> Problem:
    """``Spell to F from 147`` -> ``A four B seven ...``: each item any digit of the set, spelled."""
    _check_size("pick", size, 1)
    key, shown = _digit_set(rng, 2, 5)
    answer = " ".join(f"{LABELS[i]} {WORDS[int(rng.choice(shown))]}" for i in range(size))
    return Problem("pick", f"{key}/{size}", f"Spell to {LABELS[size - 1]} from {shown}", answer)


def make_vary(rng: random.Random, size: int) -> Problem:
    """``Vary to P from 1357`` -> ``A3B1C3D5...``: digits of the set, no digit twice in a row."""
    _check_size("vary", size, 1)
    key, shown = _digit_set(rng, 3, 6)
    digits = [rng.choice(shown)]
    for _ in range(size - 1):
        digits.append(rng.choice([d for d in shown if d != digits[-1]]))
    answer = "".join(f"{LABELS[i]}{d}" for i, d in enumerate(digits))
    return Problem("vary", f"{key}/{size}", f"Vary to {LABELS[size - 1]} from {shown}", answer)


def _labels_through(last: str) -> str:
    return LABELS[: LABELS.index(last) + 1]


def check_climb(question: str, answer: str) -> bool:
    """Items ``A``..last in order, three digits each, the first the start, each step 1-3."""
    m = re.fullmatch(r"Count to ([A-P]) from (\d{3}) by 1-3", question.strip())
    if not m or not re.fullmatch(r"(?:[A-P]\d{3})+", answer):
        return False
    items = re.findall(r"([A-P])(\d{3})", answer)
    if "".join(label for label, _ in items) != _labels_through(m.group(1)):
        return False
    values = [int(v) for _, v in items]
    return values[0] == int(m.group(2)) and all(b - a in CLIMB_STEPS for a, b in zip(values, values[1:]))


def check_pick(question: str, answer: str) -> bool:
    """``A word B word ...`` through the last label, every word a digit of the set."""
    m = re.fullmatch(r"Spell to ([A-P]) from (\d+)", question.strip())
    if not m:
        return False
    allowed = {WORDS[int(d)] for d in m.group(2)}
    tokens = answer.split(" ")
    labels, words = tokens[0::2], tokens[1::2]
    return (len(tokens) % 2 == 0 and "".join(labels) == _labels_through(m.group(1))
            and all(w in allowed for w in words))


def check_vary(question: str, answer: str) -> bool:
    """``A3B1...`` through the last label, digits of the set, no two neighbours equal."""
    m = re.fullmatch(r"Vary to ([A-P]) from (\d+)", question.strip())
    if not m or not re.fullmatch(r"(?:[A-P]\d)+", answer):
        return False
    labels, digits = answer[0::2], answer[1::2]
    return (labels == _labels_through(m.group(1)) and set(digits) <= set(m.group(2))
            and all(a != b for a, b in zip(digits, digits[1:])))


OPEN_MAKERS: dict[str, Callable[[random.Random, int], Problem]] = {
    "climb": make_climb, "pick": make_pick, "vary": make_vary,
}
OPEN_CHECKERS: dict[str, Callable[[str, str], bool]] = {
    "climb": check_climb, "pick": check_pick, "vary": check_vary,
}
# Sizes chosen so every answer is 24-64 tokens with the long-answer tokenizer (tests check the bounds).
OPEN_SIZES: dict[str, tuple[int, int]] = {"climb": (7, 12), "pick": (5, 7), "vary": (12, 16)}
OPEN_TASKS = tuple(OPEN_MAKERS)


def check_open(task: str, question: str, answer: str) -> bool:
    """Whether ``answer`` satisfies the constraint ``question`` states (``task``: one of ``OPEN_TASKS``)."""
    if task not in OPEN_CHECKERS:
        raise ValueError(f"task {task!r} has no checker; tasks with many right answers: {', '.join(OPEN_TASKS)}")
    return OPEN_CHECKERS[task](question, answer)


def open_task_of(question: str) -> str | None:
    """The open task whose question format ``question`` has (None if none): lets demos check an answer."""
    q = question.strip()
    for task, pattern in (("climb", r"Count to [A-P] from \d{3} by 1-3"), ("pick", r"Spell to [A-P] from \d+"),
                          ("vary", r"Vary to [A-P] from \d+")):
        if re.fullmatch(pattern, q):
            return task
    return None
