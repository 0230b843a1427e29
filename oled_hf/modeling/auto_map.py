"""What a checkpoint folder needs so that ``trust_remote_code=True`` finds our classes.

The checkpoint's ``auto_map`` names two one-line shim files that import the installed package,
rather than copies of the model code: copies drift from the package, shims cannot.
"""

from __future__ import annotations

import os
from pathlib import Path

CONFIG_SHIM = "configuration_oled_llada2"
MODELING_SHIM = "modeling_oled_llada2"

AUTO_MAP = {
    "AutoConfig": f"{CONFIG_SHIM}.OledLLaDA2Config",
    "AutoModel": f"{MODELING_SHIM}.OledLLaDA2Model",
    "AutoModelForCausalLM": f"{MODELING_SHIM}.OledLLaDA2ForDiffusionLM",
}

_SHIMS = {
    CONFIG_SHIM: (
        '"""LLaDA2 config for trust_remote_code: the code lives in the oled-hf package (pip install oled-hf)."""\n'
        "from oled_hf.modeling.configuration_oled_llada2 import OledLLaDA2Config  # noqa: F401\n"
    ),
    MODELING_SHIM: (
        '"""LLaDA2 model for trust_remote_code: the code lives in the oled-hf package (pip install oled-hf)."""\n'
        "from oled_hf.modeling.modeling_oled_llada2 import (  # noqa: F401\n"
        "    OledLLaDA2ForDiffusionLM,\n"
        "    OledLLaDA2Model,\n"
        ")\n"
    ),
}


def write_code_shims(directory: str | os.PathLike) -> None:
    """Write the shim modules named by ``AUTO_MAP`` into a checkpoint folder."""
    for name, text in _SHIMS.items():
        Path(directory, f"{name}.py").write_text(text)
