"""oled-hf: expert offloading for mixture-of-experts diffusion LLMs (LLaDA2) in Transformers.

Importing the package registers the model with the Auto classes, so ``AutoModelForCausalLM``
and ``pipeline("text-generation")`` resolve ``oled_llada2`` checkpoints without remote code.
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .modeling import OledLLaDA2Config, OledLLaDA2ForDiffusionLM, OledLLaDA2Model
from .modeling.auto_map import CODE_VERSION as __version__
from .offload import OffloadConfig

AutoConfig.register(OledLLaDA2Config.model_type, OledLLaDA2Config, exist_ok=True)
AutoModel.register(OledLLaDA2Config, OledLLaDA2Model, exist_ok=True)
AutoModelForCausalLM.register(OledLLaDA2Config, OledLLaDA2ForDiffusionLM, exist_ok=True)

__all__ = ["OffloadConfig", "OledLLaDA2Config", "OledLLaDA2ForDiffusionLM", "OledLLaDA2Model", "__version__"]
