"""The long-answer toy's tokenizer: the 3-digit toy's byte-level BPE, merged on these questions' words.

Digits are single tokens; the chat frame and question words ("Reverse", " terms", ...) are one
token each; answer words (the spelled digits) are not in the merge corpus, so they come out
letter by letter, which makes ``spell`` answers long and their token positions depend on the
words before them.
"""

from __future__ import annotations

import os

from ..tokenizer import build_toy_tokenizer
from .data import QUESTION_WORDS


def build_long_tokenizer(out_dir: str | os.PathLike):
    """Save tokenizer.json, tokenizer_config.json and the chat template into ``out_dir``; reload them."""
    return build_toy_tokenizer(out_dir, words=QUESTION_WORDS)
