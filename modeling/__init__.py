"""The LLaDA2 model as Transformers custom code: configuration, model, KV cache, experts seam.

The classes are imported on first use (PEP 562), so that reading ``auto_map.CODE_VERSION``
(``oled-moe --version``) does not import torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "OledLLaDA2Config": ".configuration_oled_llada2",
    "OledLLaDA2ForDiffusionLM": ".modeling_oled_llada2",
    "OledLLaDA2Model": ".modeling_oled_llada2",
}

__all__ = ["OledLLaDA2Config", "OledLLaDA2ForDiffusionLM", "OledLLaDA2Model"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name], __name__), name)
    globals()[name] = value
    return value
