"""Random-weight checkpoints at full size, written chunk by chunk (never a whole tensor in memory).

LLaDA2.0-mini has 16B parameters: building it as a module and calling ``save_pretrained`` would
need 64 GB in fp32, and even ``safetensors.save_file`` of one 5 GB shard holds the shard twice
(its tensors and their bytes). Here the tensor names and shapes come from a meta-device model, the
shards are planned from those sizes alone (so the names are the official ``model-XXXXX-of-XXXXX``
and the free disk is checked before the first byte), and each shard is written as safetensors by
hand: its header, then every tensor's bytes, drawn and cast ``CHUNK`` elements at a time and
appended. Peak memory is a few chunks (~0.3 GB), whatever the model's size.

Determinism: each tensor draws from its own generator, seeded by the checkpoint's seed and the
tensor's name, in chunks of a fixed size; so a folder is byte-identical for a seed on one machine,
and a ``num_hidden_layers``-cut variant holds exactly the same tensors as the full model for the
names they share. Init scale: linear weights and embeddings ~ N(0, ``initializer_range``) (0.02,
the official config's), norms 1, the router's ``expert_bias`` ~ N(0, 0.05) in fp32 (the official
buffer's dtype), so routing is not uniform.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..fileio import size_text, write_folder_atomically
from ..modeling import OledLLaDA2Config, OledLLaDA2ForDiffusionLM
from ..modeling.auto_map import AUTO_MAP, CODE_VERSION, write_model_code
from ..progress import progress
from .output_folder import check_output_folder, detach_links, nearest_folder, remove_stale_shards

CHUNK = 1 << 24  # elements drawn at a time (64 MiB of fp32)
SAFETENSORS_NAME = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
DISK_MARGIN = 256 << 20  # free bytes left after the write, for the tokenizer, the metadata and the filesystem
EXPERT_BIAS_STD = 0.05


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the checkpoint, as planned before anything is drawn."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True)
class WriteResult:
    """What a write cost: the folder, the bytes of its weight shards, seconds, and the shard count."""

    path: Path
    weight_bytes: int
    seconds: float
    shards: int


def plan_tensors(config: OledLLaDA2Config, dtype: torch.dtype) -> list[TensorSpec]:
    """Every tensor of the model in ``state_dict`` order (the official names), none allocated."""
    if dtype not in SAFETENSORS_NAME:
        raise ValueError(f"dtype={dtype} is not allowed; allowed: {', '.join(map(str, SAFETENSORS_NAME))}")
    with torch.device("meta"):
        meta = OledLLaDA2ForDiffusionLM(config)
    return [TensorSpec(name, tuple(t.shape), torch.float32 if name.endswith("expert_bias") else dtype)
            for name, t in meta.state_dict().items()]


def plan_shards(specs: list[TensorSpec], shard_bytes: int) -> list[list[TensorSpec]]:
    """Tensors grouped into shards of at most ``shard_bytes`` each (a larger tensor gets a shard alone)."""
    if shard_bytes < 1:
        raise ValueError(f"shard_bytes={shard_bytes} is invalid: must be >= 1")
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        if shards[-1] and size + spec.nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += spec.nbytes
    return shards


def shard_names(count: int) -> list[str]:
    """``model-00001-of-00007.safetensors``, ...: the names ``save_pretrained`` and the official release use."""
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def header_bytes(specs: list[TensorSpec]) -> bytes:
    """A safetensors header (length prefix included) for ``specs`` laid out back to back in order."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for spec in specs:
        header[spec.name] = {"dtype": SAFETENSORS_NAME[spec.dtype], "shape": list(spec.shape),
                             "data_offsets": [offset, offset + spec.nbytes]}
        offset += spec.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data region starts 8-byte aligned, as the library writes it
    return struct.pack("<Q", len(text)) + text


def tensor_seed(seed: int, name: str) -> int:
    """A generator seed of its own for each tensor: the checkpoint's seed and the tensor's name."""
    digest = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def tensor_chunks(spec: TensorSpec, seed: int, std: float):
    """The tensor's values, ``CHUNK`` elements at a time, already cast to its dtype (1-D, contiguous)."""
    n = spec.numel
    if spec.name.endswith("norm.weight"):
        for start in range(0, n, CHUNK):
            yield torch.ones(min(CHUNK, n - start), dtype=spec.dtype)
        return
    scale = EXPERT_BIAS_STD if spec.name.endswith("expert_bias") else std
    generator = torch.Generator().manual_seed(tensor_seed(seed, spec.name))
    for start in range(0, n, CHUNK):
        values = torch.randn(min(CHUNK, n - start), generator=generator)
        values.mul_(scale)
        yield values if spec.dtype == torch.float32 else values.to(spec.dtype)


def write_shard(path: Path, specs: list[TensorSpec], seed: int, std: float, advance=lambda nbytes: None) -> None:
    """Write one safetensors shard; ``advance(nbytes)`` after each chunk (the progress line)."""
    with open(path, "wb") as f:
        header = header_bytes(specs)
        f.write(header)
        advance(len(header))
        for spec in specs:
            for chunk in tensor_chunks(spec, seed, std):
                data = chunk.view(torch.uint8).numpy()
                f.write(memoryview(data))
                advance(data.nbytes)


def check_free_disk(out: Path, needed: int) -> None:
    """Refuse, before anything is written, a checkpoint the disk under ``out`` cannot hold."""
    parent = nearest_folder(out)
    free = shutil.disk_usage(parent).free
    if free < needed + DISK_MARGIN:
        raise ValueError(
            f"{out}: this checkpoint needs {size_text(needed)} of disk (+{DISK_MARGIN >> 20} MiB margin) "
            f"but the disk holding {parent} has {size_text(free)} free; nothing was written: free space "
            "or choose a folder on another disk")


def write_random_checkpoint(out_dir: str | os.PathLike, config: OledLLaDA2Config, *, seed: int = 0,
                            dtype: torch.dtype = torch.bfloat16, shard_bytes: int = 5 * 10**9,
                            generation: dict | None = None, overwrite: bool = False,
                            tokenizer=None, quiet: bool = False) -> WriteResult:
    """Write a random checkpoint of ``config`` to ``out_dir``, which must be new or empty unless ``overwrite``.

    Every check (folder, dtype, free disk for the planned shards) runs before the first byte. Built
    in a temporary sibling folder and renamed into place, so a failure half-way (a 32 GB write on a
    full disk) leaves no file of it. With ``overwrite``, links among the folder's checkpoint files
    are removed (their targets are kept), other files are replaced by name, and shards the new
    index does not name are deleted. ``tokenizer``: ``build(folder)`` writing the tokenizer files
    (None: no tokenizer). ``shard_bytes``: 5 GB, the shard size ``save_pretrained`` used for years.
    Progress goes to stderr (``oled_hf.progress``: a bar on a terminal, a line with the time left
    every 10 s in a log; nothing with ``quiet``): mini takes minutes.
    """
    start = time.perf_counter()
    out = check_output_folder(out_dir, overwrite=overwrite)
    shards = plan_shards(plan_tensors(config, dtype), shard_bytes)
    weight_bytes = sum(len(header_bytes(s)) + sum(t.nbytes for t in s) for s in shards)
    check_free_disk(out, weight_bytes)
    written: list[str] = []
    bar = progress(total=max(1, weight_bytes >> 20), desc=f"writing {out.name}", unit="MiB", quiet=quiet)
    done = [0]  # bytes written; the bar counts whole MiB

    def advance(nbytes: int) -> None:
        before = done[0] >> 20
        done[0] += nbytes
        bar.update((done[0] >> 20) - before)

    def build(folder: Path) -> None:
        _write_files(folder, config, shards, seed=seed, dtype=dtype, generation=generation, advance=advance)
        if tokenizer is not None:
            tokenizer(folder)
        written.extend(p.name for p in folder.iterdir())

    with bar:
        write_folder_atomically(build, out, before_install=detach_links)
    remove_stale_shards(out, keep=written)
    return WriteResult(out, weight_bytes, time.perf_counter() - start, len(shards))


def _write_files(out: Path, config: OledLLaDA2Config, shards: list[list[TensorSpec]], *, seed: int,
                 dtype: torch.dtype, generation: dict | None, advance=lambda nbytes: None) -> None:
    """Every file of the checkpoint into the (new, temporary) folder ``out``."""
    weight_map = {}
    for name, specs in zip(shard_names(len(shards)), shards):
        write_shard(out / name, specs, seed, config.initializer_range, advance)
        weight_map.update({spec.name: name for spec in specs})
    total = sum(spec.nbytes for specs in shards for spec in specs)  # tensor bytes, as save_pretrained counts
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
