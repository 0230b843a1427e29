"""Random-weight checkpoints at full size, written tensor by tensor (never a whole model in memory).

LLaDA2.0-mini has 16B parameters: building it as a module and calling ``save_pretrained`` would
need 64 GB in fp32. Here the tensor names and shapes come from a meta-device model, and each
tensor is drawn, cast and appended to the current shard on its own. Used by ``eval/gpu_check.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..fileio import write_folder_atomically
from ..modeling import OledLLaDA2Config, OledLLaDA2ForDiffusionLM
from ..modeling.auto_map import AUTO_MAP, CODE_VERSION, write_model_code
from .output_folder import check_output_folder, detach_links, remove_stale_shards, safetensors_os_errors


def _random_tensor(name: str, shape: torch.Size, dtype: torch.dtype, generator: torch.Generator, std: float):
    if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
        return torch.ones(shape, dtype=dtype)
    if name.endswith("expert_bias"):
        return torch.randn(shape, generator=generator) * 0.05  # fp32, like the official buffer
    return (torch.randn(shape, generator=generator) * std).to(dtype)


def write_random_checkpoint(out_dir: str | os.PathLike, config: OledLLaDA2Config, *, seed: int = 0,
                            dtype: torch.dtype = torch.bfloat16, shard_bytes: int = 2 << 30,
                            generation: dict | None = None, overwrite: bool = False) -> Path:
    """Write a random checkpoint of ``config`` to ``out_dir``, which must be new or empty unless ``overwrite``.

    Built in a temporary sibling folder and renamed into place, so a failure half-way (a 32 GB
    write on a full disk) leaves no file of it. With ``overwrite``, links among the folder's
    checkpoint files are removed (their targets are kept), other files are replaced by name, and
    shards the new index does not name are deleted.
    """
    out = check_output_folder(out_dir, overwrite=overwrite)
    written: list[str] = []

    def build(folder: Path) -> None:
        with safetensors_os_errors():
            _write_files(folder, config, seed=seed, dtype=dtype, shard_bytes=shard_bytes,
                         generation=generation)
        written.extend(p.name for p in folder.iterdir())

    write_folder_atomically(build, out, before_install=detach_links)
    remove_stale_shards(out, keep=written)
    return out


def _write_files(out: Path, config: OledLLaDA2Config, *, seed: int, dtype: torch.dtype, shard_bytes: int,
                 generation: dict | None) -> None:
    """Every file of the checkpoint into the (new, temporary) folder ``out``."""
    with torch.device("meta"):
        meta = OledLLaDA2ForDiffusionLM(config)
    generator = torch.Generator().manual_seed(seed)
    weight_map, shard, shard_size, shard_names = {}, {}, 0, []

    def flush():
        nonlocal shard, shard_size
        if shard:
            name = f"model-{len(shard_names) + 1:05d}.safetensors"
            save_file(shard, str(out / name), metadata={"format": "pt"})
            shard_names.append(name)
            for key in shard:
                weight_map[key] = name
            shard, shard_size = {}, 0

    for name, tensor in meta.state_dict().items():
        value = _random_tensor(name, tensor.shape, dtype, generator, config.initializer_range)
        if shard_size + value.numel() * value.element_size() > shard_bytes:
            flush()
        shard[name] = value
        shard_size += value.numel() * value.element_size()
    flush()
    total = sum((out / n).stat().st_size for n in shard_names)
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    config_dict = config.to_dict()
    config_dict.update(architectures=["OledLLaDA2ForDiffusionLM"], auto_map=dict(AUTO_MAP),
                       oled_hf_version=CODE_VERSION,
                       dtype=str(dtype).replace("torch.", ""))
    (out / "config.json").write_text(json.dumps(config_dict, indent=2, default=str))
    write_model_code(out)
    gen = {"block_length": 32, "threshold": 0.95, "steps": 32, "max_new_tokens": 64, "do_sample": False,
           "eos_token_id": config.eos_token_id, "pad_token_id": config.pad_token_id,
           "mask_token_id": config.mask_token_id, **(generation or {})}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2))
