"""A second trained toy LLaDA2 MoE, shaped like LLaDA2.0-mini's routing, whose answers span many blocks.

256 routed experts, top-8 over 8 groups keeping 4, one shared expert, layer 0 dense; the shipped
checkpoint (``LONG_CHECKPOINT``, 3 MoE layers) was trained on four synthetic tasks
(``tasks.SHIPPED_TASKS``: reverse and spell labelled digits, count, step-by-step addition) with
24-51-token answers, so a greedy decode at block 16 / threshold 0.95 runs several blocks of several
iterations each: the routing traces retention policies are meant for. New models (``train.py
--preset deep``: 8 MoE layers) train on ``tasks.DEFAULT_TASKS``, which adds tasks with many right
answers (``open_tasks.py``) so that decoding hesitates by choice. A checkpoint's report names its
mix (:func:`load_mix`); ``python -m oled_hf.toy.long.evaluate [CHECKPOINT]`` prints its figures.
``DEEP_CHECKPOINT`` is the deep model (8 MoE layers, ``DEFAULT_TASKS``), ``oled_hf/toy/deep``: in a clone of
the repository only (54 MB; the wheel ships the two smaller toys).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

LONG_CHECKPOINT = Path(__file__).resolve().parent / "checkpoint"
DEEP_CHECKPOINT = Path(__file__).resolve().parents[1] / "deep" / "checkpoint"
REPORT_NAME = "long_report.json"


def load_mix(checkpoint: str | os.PathLike = LONG_CHECKPOINT):
    """The task mix a checkpoint was trained on (from its report), else the default mix."""
    from .tasks import DEFAULT_MIX, parse_mix

    path = Path(checkpoint) / REPORT_NAME
    tasks = json.loads(path.read_text()).get("tasks") if path.is_file() else None
    return parse_mix(tasks) if tasks else DEFAULT_MIX


def demo_prompts(n_per_task: int = 1) -> list[str]:
    """Held-out questions of the shipped mix (never seen in training), for demos and traces."""
    from .tasks import heldout_problems

    return [p.question for spec in load_mix() for p in heldout_problems(spec, n_per_task)]


__all__ = ["DEEP_CHECKPOINT", "LONG_CHECKPOINT", "REPORT_NAME", "demo_prompts", "load_mix"]
