"""``oled-moe make-tiny``: a complete random-weight LLaDA2 checkpoint in the official layout.

Sharded safetensors with the official tensor names, an index, ``config.json`` with ``auto_map``
and the model's code files, ``generation_config.json`` and a real trained tokenizer with LLaDA2's special tokens
and chat template. Deterministic for a seed, so tests and benchmarks are reproducible.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import GenerationConfig

from ..fileio import write_folder_atomically
from ..modeling import OledLLaDA2Config, OledLLaDA2ForDiffusionLM
from .families import decoding_defaults
from .output_folder import check_output_folder, detach_links, remove_stale_shards, safetensors_os_errors
from .presets import DEFAULT_DTYPE, SHARD_SIZE, STREAMED, preset_config_kwargs
from .streaming import write_random_checkpoint
from .tokenizer import build_official_tokenizer, build_tokenizer, check_official_vocab_size, special_token_ids

GENERATION_DEFAULTS = dict(block_length=32, threshold=0.95, steps=32, max_new_tokens=64, do_sample=False,
                           eos_early_stop=True)
DTYPES = ("float32", "bfloat16", "float16")


def parse_size(text: str) -> int:
    """Bytes of a shard size as ``save_pretrained`` spells it (``"5GB"``: accelerate's rule)."""
    from accelerate.utils import convert_file_size_to_int

    return int(convert_file_size_to_int(text))


def make_config(preset: str = "tiny", **overrides) -> OledLLaDA2Config:
    kwargs = preset_config_kwargs(preset, **overrides)
    if preset in STREAMED:  # LLaDA2's own special ids (the config's defaults)
        return OledLLaDA2Config(**kwargs)
    ids = special_token_ids(kwargs["vocab_size"])
    return OledLLaDA2Config(
        **kwargs,
        pad_token_id=ids["pad_token_id"],
        eos_token_id=ids["eos_token_id"],
        bos_token_id=ids["bos_token_id"],
        mask_token_id=ids["mask_token_id"],
    )


def random_model(config: OledLLaDA2Config, seed: int = 0, dtype: torch.dtype = torch.float32):
    """Random weights, with a non-zero expert bias so tests see selection differ from weighting."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = OledLLaDA2ForDiffusionLM(config).eval()
        with torch.no_grad():
            for block in model.moe_blocks():
                block.gate.expert_bias.copy_(torch.randn(config.num_experts) * 0.05)
    finally:
        torch.random.set_rng_state(generator_state)
    return model.to(dtype) if dtype != torch.float32 else model


def generation_config_for(config: OledLLaDA2Config, **overrides) -> GenerationConfig:
    values = {**GENERATION_DEFAULTS, **overrides}
    return GenerationConfig(
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        bos_token_id=config.bos_token_id,
        mask_token_id=config.mask_token_id,
        **values,
    )


def make_checkpoint(
    out_dir: str | os.PathLike,
    *,
    preset: str = "tiny",
    seed: int = 0,
    dtype: str | None = None,
    family: str = "llada2.0",
    overwrite: bool = False,
    quiet: bool = False,
    **overrides,
) -> Path:
    """Write a checkpoint folder and return its path; ``family="llada2.1"`` writes 2.1 decoding defaults.

    ``dtype`` None: the preset's (``presets.DEFAULT_DTYPE``: bfloat16 for ``mini``, else float32).
    A ``STREAMED`` preset (``mini``) is written tensor by tensor (``streaming.write_random_checkpoint``:
    a few hundred MB of memory whatever the size, free disk checked before the first byte).

    ``out_dir`` must be new or empty unless ``overwrite=True``. The checkpoint is built in a
    temporary sibling folder and renamed into place (:func:`~oled_hf.fileio.write_folder_atomically`):
    a failure half-way (full disk, ``ulimit -f``) leaves no file of it and ``out_dir`` as it was.
    With ``overwrite``, symlinks and hard links among the folder's checkpoint files are removed
    (the files they point to, another checkpoint's, are kept), the new files replace theirs by
    name, and the folder's other ``model-XXXXX-of-XXXXX.safetensors`` shards are deleted, as
    ``save_pretrained`` into the folder did. ``quiet``: no progress on stderr (a streamed preset shows it).
    """
    dtype = DEFAULT_DTYPE.get(preset, "float32") if dtype is None else dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not allowed; allowed: {', '.join(DTYPES)}")
    config = make_config(preset, **overrides)
    decoding = decoding_defaults(family)
    if preset in STREAMED:
        check_official_vocab_size(config.vocab_size)  # the tokenizer is written last: refuse before the weights
        return write_random_checkpoint(
            out_dir, config, seed=seed, dtype=getattr(torch, dtype), shard_bytes=parse_size(SHARD_SIZE[preset]),
            generation={**GENERATION_DEFAULTS, **decoding}, overwrite=overwrite, quiet=quiet,
            tokenizer=lambda folder: build_official_tokenizer(folder, config.vocab_size)).path
    out = check_output_folder(out_dir, overwrite=overwrite)
    torch_dtype = getattr(torch, dtype)
    model = random_model(config, seed=seed, dtype=torch_dtype)
    model.config.dtype = torch_dtype
    model.generation_config = generation_config_for(config, **decoding)
    written: list[str] = []

    def build(folder: Path) -> None:
        with safetensors_os_errors():
            model.save_pretrained(folder, max_shard_size=SHARD_SIZE.get(preset, "100MB"))
        build_tokenizer(folder, config.vocab_size, seed=seed)
        written.extend(p.name for p in folder.iterdir())

    write_folder_atomically(build, out, before_install=detach_links)
    remove_stale_shards(out, keep=written)
    return out
