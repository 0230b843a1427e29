"""Model families and the decoding defaults their ``generation_config.json`` gets.

LLaDA2.0 and LLaDA2.1 share the architecture and the config (shared/docs/llada2.md §1, §5.5);
they differ in how they decode: 2.0 only unmasks, 2.1 also edits decoded tokens and runs post
steps. 2.1 checkpoints get the ``quality`` preset (threshold 0.7, editing 0.5, 16 post steps),
2.0 checkpoints no editing, as the LLaDA2.1 guidance says ("disable editing for 2.0 models").
"""

from __future__ import annotations

import re
from pathlib import Path

FAMILIES = ("llada2.0", "llada2.1")
_LLADA21 = re.compile(r"llada[-_]?2\.1", re.IGNORECASE)


def check_family(family: str) -> str:
    if family not in FAMILIES:
        raise ValueError(f"family={family!r} is unknown; allowed: {', '.join(FAMILIES)}")
    return family


def decoding_defaults(family: str) -> dict:
    """Generation-config entries for a family: none for 2.0, the ``quality`` preset named and spelled out
    for 2.1 (spelled out so a reader of the file, or a loader without presets, sees the values)."""
    if check_family(family) == "llada2.0":
        return {}
    from ..modeling.params import DECODING_PRESETS  # here: FAMILIES is read by `oled-moe --help`, without torch

    return {"decoding": "quality", **DECODING_PRESETS["quality"]}


def detect_family(src: Path, config: dict) -> str:
    """``llada2.1`` when the folder (any part of its resolved path, e.g. a Hub cache's
    ``models--inclusionAI--LLaDA2.1-mini``) or the config's ``_name_or_path`` names LLaDA2.1: the
    config itself does not tell the two apart."""
    names = [*Path(src).resolve().parts, str(config.get("_name_or_path") or "")]
    return "llada2.1" if any(_LLADA21.search(n) for n in names) else "llada2.0"
