"""LLaDA2 config for trust_remote_code: the code lives in the oled-hf package (pip install oled-hf)."""
from oled_hf.modeling.configuration_oled_llada2 import OledLLaDA2Config  # noqa: F401
