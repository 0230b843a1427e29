"""LLaDA2 model for trust_remote_code: the code lives in the oled-hf package (pip install oled-hf)."""
from oled_hf.modeling.modeling_oled_llada2 import (  # noqa: F401
    OledLLaDA2ForDiffusionLM,
    OledLLaDA2Model,
)
