"""Checks of a checkpoint's files before any weight is read: every error names the file and the fault.

Transformers reads safetensors headers and the shard index itself, and its failures on a damaged
file (a truncated header, bad JSON, a tensor in two shards, an int8 tensor where a float weight
goes) either name no file or load silently. ``check_checkpoint_files`` reads only the headers
(a few KB per shard) and raises :class:`CheckpointError` naming the file, the tensor and what
is wrong; ``check_loading_info`` turns Transformers' missing/unexpected keys into an error.

Whether a file is valid safetensors is the ``safetensors`` library's decision (``safe_open``, the
code Transformers loads with), so this module never accepts a file the loader would refuse nor
refuses one it accepts (a new dtype, say). What the library cannot do is kept here, each for a
reason: its errors name no file and one message ("incomplete metadata, file not fully covered")
covers both a truncated file and appended bytes, so :func:`_diagnose` re-reads a refused header
to say which tensor and which bytes are wrong; and it does not expose tensors' byte offsets,
which the expert store needs to read an expert straight into a pinned buffer or map it
(``read_safetensors_header`` returns them).
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

INDEX_NAME = "model.safetensors.index.json"
# bytes per element of the safetensors dtypes, for diagnosis only (safe_open decides what is valid)
DTYPE_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "F8_E4M3FNUZ": 1,
               "F8_E5M2FNUZ": 1, "F6_E2M3": 0.75, "F6_E3M2": 0.75, "F4": 0.5, "I64": 8, "I32": 4, "I16": 2,
               "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "C64": 8}
INTEGER_DTYPES = {"I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL"}
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors library's own limit
EXPERT_KEY = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")


class CheckpointError(ValueError):
    """A checkpoint file is damaged or does not match the model; the message names the file."""


def read_safetensors_header(path: str | os.PathLike) -> tuple[dict, int]:
    """The header of a safetensors file (without ``__metadata__``) and where tensor data starts.

    ``safe_open`` validates the file; a file it refuses raises ``CheckpointError`` naming the file,
    the fault as :func:`_diagnose` finds it, and the library's own reason.
    """
    path = str(path)
    size = os.path.getsize(path)
    try:
        with safe_open(path, framework="pt"):
            pass
    except SafetensorError as e:
        reason = str(e).removeprefix("Error while deserializing header: ")
        raise CheckpointError(f"{path}: not a valid safetensors file: {_diagnose(path, size) or reason} "
                              f"(safetensors: {reason})") from None
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


def _diagnose(path: str, size: int) -> str | None:
    """What is wrong with a header ``safe_open`` refused, by tensor and byte (None if not found)."""
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            return f"the file is {size} bytes, shorter than the 8-byte header length"
        (n,) = struct.unpack("<Q", prefix)
        if n > min(size - 8, MAX_HEADER_BYTES):
            return f"the header claims {n} bytes but the file has {size - 8} after the length (truncated?)"
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        return f"the header is not valid JSON ({e})"
    if not isinstance(header, dict):
        return f"the header is a JSON {type(header).__name__}, not an object"
    header.pop("__metadata__", None)
    data = size - 8 - n
    for name, info in header.items():
        fault = _check_entry(name, info, data)
        if fault:
            return fault
    return _check_coverage(header, data)


def _check_coverage(header: dict, data_bytes: int) -> str | None:
    """Tensors must tile the data region exactly, as the safetensors library requires.

    Its own error for bytes appended after the last tensor ("incomplete metadata, file not fully
    covered") names no file; overlapping tensors would alias each other's bytes.
    """
    end, previous = 0, None
    for name, info in sorted(header.items(), key=lambda item: tuple(item[1]["data_offsets"])):
        start, stop = info["data_offsets"]
        if start != end:
            where = f"the previous tensor {previous!r} ends at {end}" if previous else "the data starts at 0"
            kind = "overlaps another tensor" if start < end else f"leaves {start - end} unused bytes before it"
            return f"tensor {name!r} starts at byte {start} of the data but {where}: it {kind}"
        end, previous = stop, name
    if end != data_bytes:
        return (f"{data_bytes - end} bytes of trailing data follow the last tensor (its data ends at byte {end} "
                f"of {data_bytes}); the file was appended to or damaged")
    return None


def _check_entry(name: str, info, data_bytes: int) -> str | None:
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
        return f"tensor {name!r} lacks dtype, shape or data_offsets"
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if dtype not in DTYPE_SIZES:
        return f"tensor {name!r} has unknown dtype {dtype!r}"
    if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
        return f"tensor {name!r} has an invalid shape {shape!r}"
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
            and 0 <= offsets[0] <= offsets[1]):
        return f"tensor {name!r} has invalid data_offsets {offsets!r}"
    if offsets[1] > data_bytes:
        return (f"tensor {name!r} ends at byte {offsets[1]} of the data but the file holds {data_bytes} "
                "(truncated?)")
    numel = 1
    for d in shape:
        numel *= d
    if offsets[1] - offsets[0] != numel * DTYPE_SIZES[dtype]:
        return (f"tensor {name!r} ({dtype} {shape}) should take {int(numel * DTYPE_SIZES[dtype])} bytes but "
                f"its data_offsets span {offsets[1] - offsets[0]}")
    return None


def read_index(path: str | os.PathLike) -> dict[str, str]:
    """The ``weight_map`` of a shard index (tensor name -> shard file name), validated."""
    try:
        index = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not a valid shard index: invalid JSON ({e})") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in weight_map.items()):
        raise CheckpointError(f"{path}: not a valid shard index: it needs a \"weight_map\" object mapping "
                              "tensor names to shard file names")
    if not weight_map:
        raise CheckpointError(f"{path}: not a valid shard index: its \"weight_map\" is empty; it must map every "
                              "tensor name to the shard file that holds it")
    for tensor, shard in weight_map.items():
        if not is_plain_file_name(shard):
            raise CheckpointError(
                f"{path}: not a valid shard index: tensor {tensor} is mapped to {shard!r}, which is not a file name "
                "in the checkpoint folder; shards must be named without directories, '..' or absolute paths")
        if not shard.endswith(".safetensors") or shard == Path(path).name:
            # config.json, the index itself: Transformers would torch.load them ("Weights only load failed")
            raise CheckpointError(
                f"{path}: not a valid shard index: tensor {tensor} is mapped to {shard!r}, which is not a weight "
                "shard; a safetensors index names *.safetensors files")
    return weight_map


def is_plain_file_name(name: str) -> bool:
    """A bare file name: no directory part, not ``.``/``..``, not absolute (POSIX or Windows).

    The index is data from the checkpoint; a name such as ``../x.safetensors`` or ``/etc/x`` would
    make the load read a file outside the folder. A shard that is itself a symlink is allowed:
    ``oled-moe prepare`` and the Hugging Face cache both link shards to files stored elsewhere,
    by the folder owner's own choice.
    """
    return (bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name
            and ":" not in name and "\0" not in name)


def check_local_index(folder: str | os.PathLike) -> None:
    """A local checkpoint folder's shard index must parse and name only shards that exist.

    Transformers parses the index before any hook runs and reports bad JSON without the file's
    name, so ``from_pretrained`` calls this first for local folders.
    """
    index_path = Path(folder) / INDEX_NAME
    if not index_path.is_file():
        return
    shards = sorted(set(read_index(index_path).values()))
    absent = [name for name in shards if not (Path(folder) / name).is_file()]
    if absent:
        raise CheckpointError(f"{index_path}: lists shard(s) {', '.join(absent)} that are not in {Path(folder)}")


def check_json_file(path: str | os.PathLike, what: str) -> None:
    """Raise ``CheckpointError`` naming ``path`` if it exists and is not a JSON object."""
    if not os.path.isfile(path):
        return
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not a valid {what}: invalid JSON ({e})") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: not a valid {what}: a JSON {type(value).__name__}, not an object")


def check_checkpoint_files(files: list[str], model_tensors: dict[str, bool],
                           model_shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, str]:
    """Validate the shards' headers, tensor placement, dtypes and shapes before Transformers loads them.

    ``model_tensors`` maps each model parameter/buffer name to whether it is floating point (routed
    experts count as floating even when offloaded, so absent from the model). A
    tensor stored in two shards is refused (which one wins would depend on read order), as is an
    integer tensor bound for a floating parameter (a silent cast would turn quantised codes into
    wrong weights). With ``model_shapes`` (name -> the model's shape), a tensor whose stored shape
    differs is refused naming both shapes and the file, where Transformers would only suggest
    ``ignore_mismatched_sizes``. Returns tensor name -> the shard holding it, so later checks
    (:func:`check_finite`) can name the file.
    """
    index_path = Path(files[0]).parent / INDEX_NAME if files else None
    weight_map = read_index(index_path) if index_path is not None and index_path.is_file() else {}
    where: dict[str, str] = {}
    for path in files:
        header, _ = read_safetensors_header(path)
        for name, info in header.items():
            if model_shapes is not None:
                _check_shape(path, name, info["shape"], model_shapes)
            if name in where:
                named = weight_map.get(name)
                note = f"; {INDEX_NAME} names {named}" if named else ""
                raise CheckpointError(f"{path}: tensor {name} is also stored in {where[name]}{note}; a tensor "
                                      "must be in exactly one shard")
            where[name] = path
            # routed experts are float weights whether the model holds them or an offload store will
            if info["dtype"] in INTEGER_DTYPES and (model_tensors.get(name, False) or EXPERT_KEY.match(name)):
                raise CheckpointError(f"{path}: tensor {name} is stored as {info['dtype']} but the model's weight "
                                      "is floating point; integer (e.g. quantised) tensors are not cast to float. "
                                      "Convert the checkpoint to a float dtype first")
    return where


def model_key(name: str, model_names) -> str | None:
    """The model's name for checkpoint tensor ``name``, allowing for the ``model.`` base prefix.

    A bare ``OledLLaDA2Model`` loads ``model.*`` tensors of a full checkpoint without the prefix,
    and the full model loads a bare one's with it (Transformers strips or adds it the same way).
    """
    if name in model_names:
        return name
    for candidate in (name.removeprefix("model."), "model." + name):
        if candidate != name and candidate in model_names:
            return candidate
    return None


def _check_shape(path: str, name: str, stored: list[int], model_shapes: dict[str, tuple[int, ...]]) -> None:
    key = model_key(name, model_shapes)
    if key is None or tuple(stored) == tuple(model_shapes[key]):
        return
    raise CheckpointError(
        f"{path}: tensor {name} has shape {list(stored)} but the model built from config.json expects "
        f"{list(model_shapes[key])}; the checkpoint and config.json disagree (e.g. vocab_size, hidden_size, "
        "num_experts or an intermediate size). Fix config.json or use the checkpoint it was written with"
    )


def first_non_finite(tensor: torch.Tensor) -> tuple[int, list[int]] | None:
    """None when every value is finite, else (how many are NaN/inf, the index of the first).

    The common, all-finite case costs one ``aminmax`` pass (NaN propagates to both ends, an inf
    shows as the min or max), about 50 times faster than ``isfinite(t).all()`` on CPU and with no
    tensor-sized temporary; only a failing tensor pays for locating the bad value.
    """
    t = tensor.detach()
    if t.numel() == 0 or not t.is_floating_point() or t.device.type == "meta":
        return None
    try:
        low, high = torch.aminmax(t)
        if bool(torch.isfinite(low) & torch.isfinite(high)):
            return None
    except (RuntimeError, NotImplementedError):  # dtypes without aminmax (float8): the plain check
        if bool(torch.isfinite(t).all()):
            return None
    bad = ~torch.isfinite(t)
    first = torch.nonzero(bad)[0].tolist() if t.dim() else []
    return int(bad.sum()), first


def non_finite_message(name: str, found: tuple[int, list[int]], numel: int, dtype: torch.dtype | None = None) -> str:
    count, first = found
    # float16 is the one common load dtype narrower in range than the stored float32/bfloat16
    cause = ("the checkpoint is corrupt, or its values overflow float16 (load with dtype=torch.bfloat16)"
             if dtype == torch.float16 else "the checkpoint is corrupt. Re-download or re-convert it")
    return (f"tensor {name} holds {count} non-finite value(s) (NaN or inf) of {numel}, the first at index "
                f"{first}; {cause}")


def check_finite(tensors, where: dict[str, str], source) -> None:
    """Refuse a load whose floating weights hold NaN or inf, naming the tensor and its shard.

    ``tensors`` is (model name, tensor) pairs, ``where`` the checkpoint name -> shard map from
    :func:`check_checkpoint_files`. Runs once per tensor at load, so a corrupt weight is an
    error before any generate rather than different tokens (a NaN ``expert_bias`` never shows in
    the logits) or a NaN at the first forward.
    """
    for name, tensor in tensors:
        found = first_non_finite(tensor)
        if found is None:
            continue
        key = model_key(name, where)
        if key is None:
            raise CheckpointError(f"{source}: after loading, "
                                  f"{non_finite_message(name, found, tensor.numel(), tensor.dtype)}")
        raise CheckpointError(f"{where[key]}: {non_finite_message(key, found, tensor.numel(), tensor.dtype)}")


def check_loading_info(model_name: str, source, missing: set[str], unexpected: set[str]) -> None:
    """Refuse a load that would leave random weights (missing) or drop checkpoint tensors (unexpected)."""
    if not missing and not unexpected:
        return
    parts = []
    if missing:
        parts.append(f"missing {len(missing)} tensor(s) the model needs: {_some(missing)}")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected tensor(s) the model has no place for: {_some(unexpected)}")
    raise CheckpointError(
        f"{source}: the checkpoint does not match {model_name} (config.json): {'; '.join(parts)}. Missing weights "
        "would be randomly initialised. Fix the checkpoint or config.json, or pass strict=False to "
        "from_pretrained to load anyway"
    )


def _some(names: set[str], limit: int = 8) -> str:
    ordered = sorted(names)
    more = f" and {len(ordered) - limit} more" if len(ordered) > limit else ""
    return ", ".join(ordered[:limit]) + more
