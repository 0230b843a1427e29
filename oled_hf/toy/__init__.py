"""A trained toy LLaDA2 MoE (3-digit addition) for accuracy checks and expert-policy traces.

``TOY_CHECKPOINT`` is the shipped checkpoint folder (official layout, our classes); ``train_toy``
rebuilds it (``python -m oled_hf.toy.train OUT``); ``TOY_DATA_DIR`` holds the task as JSONL
(``question``, ``answer``, ``choices``, ``label``) for lm-eval.
"""

from pathlib import Path

TOY_CHECKPOINT = Path(__file__).resolve().parent / "checkpoint"
# lm-eval files written by ``python -m oled_hf.toy.data``: train.jsonl (few-shot pool), test.jsonl (held out).
TOY_DATA_DIR = Path(__file__).resolve().parent / "jsonl"


def demo_prompts(n: int = 3) -> list[str]:
    """Held-out questions (never seen in training), for ``make demo`` and ``oled-moe chat`` examples."""
    from .data import heldout_pairs, question_text

    return [question_text(a, b) for a, b in heldout_pairs(n)]


def train_toy(out_dir, seed: int = 0, **kwargs):
    """See :func:`oled_hf.toy.train.train_toy` (imported lazily: it pulls in torch and transformers)."""
    from .train import train_toy as _train_toy

    return _train_toy(out_dir, seed=seed, **kwargs)


__all__ = ["TOY_CHECKPOINT", "TOY_DATA_DIR", "demo_prompts", "train_toy"]
