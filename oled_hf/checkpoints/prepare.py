"""``oled-moe prepare SRC OUT``: make an official LLaDA2 checkpoint load as our classes.

OUT gets a ``config.json`` naming our classes (every official field kept), the model's code files,
a ``generation_config.json`` with block-diffusion defaults (LLaDA2.1 folders, recognised by name
or given ``family="llada2.1"``, get the 2.1 editing preset), and *symlinks* to SRC's weight shards
and tokenizer files: a 16B checkpoint is never copied.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..modeling.auto_map import AUTO_MAP, CODE_VERSION, write_model_code
from ..modeling.configuration_oled_llada2 import OledLLaDA2Config
from .families import check_family, decoding_defaults, detect_family

LINKED_PATTERNS = ("*.safetensors", "model.safetensors.index.json", "tokenizer*", "special_tokens_map.json",
                   "chat_template.jinja", "vocab*", "merges.txt", "added_tokens.json")
GENERATION_DEFAULTS = dict(block_length=32, threshold=0.95, steps=32, max_new_tokens=256, do_sample=False,
                           eos_early_stop=True)


def _read_source_config(src: Path) -> dict:
    path = src / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{src} has no config.json: expected a LLaDA2 checkpoint folder")
    config = json.loads(path.read_text())
    if config.get("model_type") not in ("llada2_moe", OledLLaDA2Config.model_type):
        raise ValueError(
            f"{path} has model_type={config.get('model_type')!r}; prepare accepts 'llada2_moe' "
            f"(official LLaDA2) or {OledLLaDA2Config.model_type!r}"
        )
    if not any(src.glob("*.safetensors")):
        raise FileNotFoundError(f"{src} has no *.safetensors weight files")
    return config


def prepare_checkpoint(src: str | os.PathLike, out: str | os.PathLike, family: str | None = None) -> Path:
    """``family`` (``llada2.0`` / ``llada2.1``) overrides the one recognised from SRC's name."""
    src, out = Path(src).resolve(), Path(out)
    config = _read_source_config(src)
    family = detect_family(src, config) if family is None else check_family(family)
    config.pop("auto_map", None)
    # Validates every field and fills ours (mask id, etc.) with LLaDA2's defaults.
    ours = OledLLaDA2Config.from_dict(config)
    out.mkdir(parents=True, exist_ok=True)
    serialised = ours.to_dict()
    serialised["architectures"] = ["OledLLaDA2ForDiffusionLM"]
    serialised["auto_map"] = dict(AUTO_MAP)
    serialised["oled_hf_version"] = CODE_VERSION
    (out / "config.json").write_text(json.dumps(serialised, indent=2, sort_keys=True, default=str) + "\n")
    write_model_code(out)
    linked = []
    for pattern in LINKED_PATTERNS:
        for file in sorted(src.glob(pattern)):
            target = out / file.name
            if target.is_symlink() or target.exists():
                target.unlink()
            target.symlink_to(file)
            linked.append(file.name)
    _write_generation_config(src, out, ours, family)
    return out


def _write_generation_config(src: Path, out: Path, config: OledLLaDA2Config, family: str) -> None:
    values = {**GENERATION_DEFAULTS, **decoding_defaults(family)}
    official = src / "generation_config.json"
    if official.is_file():
        values.update({k: v for k, v in json.loads(official.read_text()).items() if k != "transformers_version"})
    values.update(eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id,
                  mask_token_id=config.mask_token_id)
    target = out / "generation_config.json"
    if target.is_symlink():
        target.unlink()
    target.write_text(json.dumps(values, indent=2, sort_keys=True) + "\n")
