"""The LLaDA2 model as Transformers custom code: configuration, model, KV cache, experts seam."""

from .configuration_oled_llada2 import OledLLaDA2Config
from .modeling_oled_llada2 import OledLLaDA2ForDiffusionLM, OledLLaDA2Model

__all__ = ["OledLLaDA2Config", "OledLLaDA2ForDiffusionLM", "OledLLaDA2Model"]
