"""ExpertStore: one host-resident copy of every routed expert, read straight from safetensors.

Routed-expert tensors never go through ``from_pretrained`` (the model is built without them), so
they are never materialised on the device outside the cache pool. Two layouts:

* ``pinned`` (``auto`` where it fits the host's available memory, else ``mmap``: ``choose_store``):
  one contiguous buffer per MoE layer, ``[E, 3*I*H]`` (gate, up, down of an expert side by side),
  page-locked where CUDA exists, filled with plain file reads (no mmap: the page cache is not
  counted twice in the process's memory). One expert is one contiguous, 64-byte-aligned row: one
  DMA to a cache slot, and the same CPU GEMM code path as the resident model's aligned weights (so
  CPU-computed misses round exactly like resident ones). The buffers are ordinary allocations of
  their exact size, page-locked in place (``cudaHostRegister``, :func:`pinned_reserve_bytes`): the
  caching host allocator behind ``pin_memory=True`` rounds every block up to a power of two, so
  LLaDA2.0-mini's 1.5 GiB layers would take 2 GiB each (38 GiB instead of 28.5 for 19 layers) and
  the fit check, which counts the exact size, would let a load through that the host cannot take.
* ``mmap``: zero-copy views into the safetensors files; nothing is read until used. Lowest memory,
  but views are only 8-byte aligned, so on a CPU-only machine CPU-computed experts may round
  differently from the resident model (tokens can differ in rare near-ties).

Every expert is checked finite (no NaN/inf) as it enters the store: pinned, once per layer right
after it is read (one ``aminmax`` pass); mmap, at its first use, since reading every mapped byte at
load would defeat the mapping. The error names the tensor and its shard.

The ``safetensors`` library validates every shard (``checkpoint_files.read_safetensors_header``
calls ``safe_open``), but the bytes are read here: its ``get_tensor`` allocates a new tensor per
call, while the pinned layout needs each expert read straight into its row of one page-locked
buffer (no second host copy, no unpinned staging), and the mmap layout needs the tensors' byte
offsets, which the library does not expose.
"""

from __future__ import annotations

import logging
import os
import re
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..modeling import checkpoint_files, placement

logger = logging.getLogger(__name__)

EXPERT_KEY = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
PARTS = ("gate_proj", "up_proj", "down_proj")
SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}


def read_safetensors_header(path: str | os.PathLike) -> tuple[dict, int]:
    """The JSON header and the byte offset where tensor data starts; a damaged file raises naming it."""
    return checkpoint_files.read_safetensors_header(path)


PAGE = 4096


def pinned_reserve_bytes(layer_bytes: int, layers: int) -> int:
    """What the pinned store takes from the host: each layer's buffer at its size in whole pages, nothing rounded
    further (page-locked in place, not from the caching host allocator, see the module docstring)."""
    return layers * (-(-layer_bytes // PAGE) * PAGE)


def default_host_pin() -> Any:
    """What page-locks the pinned store's buffers: the CUDA runtime where CUDA exists, else nothing."""
    if not torch.cuda.is_available():
        return None
    from .cuda_device import TorchCuda

    return TorchCuda(torch.device("cuda"))


def choose_store(mode: str, store_bytes: int, extra_bytes: int, available: int, total: int) -> str:
    """The store layout a load uses: ``pinned`` reads every routed expert into host memory, which a model
    larger than RAM cannot take (the OOM killer would end the load half-way), so ``auto`` falls back to
    ``mmap`` (the shards stay on disk, the page cache holds what is used) when the store and
    ``extra_bytes`` would not fit the host's available memory less its headroom, and says so in one line;
    ``pinned`` asked outright is refused before allocating."""
    if mode == "mmap":
        return mode
    keep = placement.host_headroom(total)
    if store_bytes + extra_bytes <= available - keep:
        return "pinned"
    need = (f"the routed experts need {placement.gib(store_bytes)} of host memory in store='pinned'"
            + (f" (+{placement.gib(extra_bytes)} beside them)" if extra_bytes else "")
            + f", the host has {placement.gib(available)} available ({placement.gib(keep)} kept free)")
    if mode == "pinned":
        raise ValueError(f"{need}: use store='mmap' (the experts stay in the safetensors files) or store='auto'")
    logger.warning("oled-hf: %s: using store='mmap' instead", need)
    return "mmap"


@dataclass
class ExpertLocation:
    path: str
    offset: int  # absolute byte offset in the file
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]


def index_expert_tensors(files: list[str]) -> dict[tuple[int, int, str], ExpertLocation]:
    """Map (model layer, expert, part) -> where its bytes are, from the shards' headers only."""
    found = {}
    for path in files:
        header, start = read_safetensors_header(path)
        for name, info in header.items():
            m = EXPERT_KEY.match(name)
            if m is None:
                continue
            if info["dtype"] not in SAFETENSORS_DTYPES:
                raise ValueError(f"{name} in {path} has dtype {info['dtype']}; supported: {sorted(SAFETENSORS_DTYPES)}")
            a, b = info["data_offsets"]
            found[(int(m.group(1)), int(m.group(2)), m.group(3))] = ExpertLocation(
                str(path), start + a, b - a, SAFETENSORS_DTYPES[info["dtype"]], tuple(info["shape"]))
    return found


class ExpertStore:
    """Host copies of routed experts, addressed by (MoE layer index, expert id)."""

    def __init__(self, layer_ids: list[int], num_experts: int, hidden_size: int, intermediate_size: int,
                 dtype: torch.dtype, mode: str):
        self.layer_ids = layer_ids  # model layer index of each MoE layer
        self.num_experts = num_experts
        self.hidden, self.inter = hidden_size, intermediate_size
        self.dtype, self.mode = dtype, mode
        self.numel = 3 * hidden_size * intermediate_size
        self.expert_bytes = self.numel * torch.empty((), dtype=dtype).element_size()
        self.buffers: list[torch.Tensor] = []  # pinned mode: [E, 3*I*H] per MoE layer
        self.views: list[list[tuple[torch.Tensor, ...]]] = []  # mmap mode: (gate, up, down) per expert

    @classmethod
    def from_safetensors(cls, files: list[str], layer_ids: list[int], num_experts: int, hidden_size: int,
                         intermediate_size: int, dtype: torch.dtype, mode: str = "auto",
                         extra_bytes: int = 0, pin: Any = "auto") -> ExpertStore:
        """``extra_bytes``: host memory the load will take beside the store (a cache on the CPU device).
        ``pin``: what page-locks the pinned buffers (``register``/``unregister``); "auto": CUDA where it exists."""
        if mode not in ("auto", "pinned", "mmap"):
            raise ValueError(f"store={mode!r} is unknown; allowed: auto, pinned, mmap")
        layer_bytes = num_experts * 3 * hidden_size * intermediate_size * dtype.itemsize
        store_bytes = pinned_reserve_bytes(layer_bytes, len(layer_ids))
        mode = choose_store(mode, store_bytes, extra_bytes, *placement.host_memory())
        store = cls(layer_ids, num_experts, hidden_size, intermediate_size, dtype, mode)
        locations = index_expert_tensors(files)
        expected = {(layer, e, part) for layer in layer_ids for e in range(num_experts) for part in PARTS}
        missing = sorted(expected - set(locations))
        if missing:
            names = ", ".join(f"model.layers.{layer}.mlp.experts.{e}.{part}.weight" for layer, e, part in missing[:4])
            raise checkpoint_files.CheckpointError(
                f"{Path(files[0]).parent}: the checkpoint lacks {len(missing)} routed-expert tensor(s) the offloaded "
                f"model needs: {names}{' and more' if len(missing) > 4 else ''} (strict=False cannot fill "
                "offloaded experts)")
        if mode == "mmap":
            store._map_views(locations)
        else:
            store._read_buffers(locations, default_host_pin() if pin == "auto" else pin)
        return store

    def _read_buffers(self, locations, pin: Any) -> None:
        """Read every layer into a buffer of its exact size, then page-lock it in place (``pin``; None: not)."""
        h, i = self.hidden, self.inter
        if pin is not None:  # unlocked when the store goes, before its buffers are freed
            self.pinned_ptrs: list[int] = []
            weakref.finalize(self, _unpin, pin, self.pinned_ptrs)
        for layer in self.layer_ids:
            buf = torch.empty((self.num_experts, self.numel), dtype=self.dtype)
            for e in range(self.num_experts):
                for p, part in enumerate(PARTS):
                    loc = locations[(layer, e, part)]
                    _check_shape(loc, part, h, i, layer, e)
                    dst = buf[e, p * h * i : (p + 1) * h * i]
                    _read_into(loc, dst)
            # One pass over the layer (aminmax, no temporary); only a failing layer is searched.
            if checkpoint_files.first_non_finite(buf) is not None:
                experts = ((e, split_expert(buf[e], h, i)) for e in range(self.num_experts))
                self._raise_non_finite(layer, locations, experts)
            if pin is not None:
                pin.register(buf)
                self.pinned_ptrs.append(buf.data_ptr())
            self.buffers.append(buf)

    @staticmethod
    def _raise_non_finite(layer: int, locations, experts) -> None:
        """Name the first expert tensor holding NaN/inf, with its shard file; ``experts``: (id, parts) pairs."""
        for e, parts in experts:
            for part, tensor in zip(PARTS, parts):
                found = checkpoint_files.first_non_finite(tensor)
                if found is not None:
                    name = f"model.layers.{layer}.mlp.experts.{e}.{part}.weight"
                    raise checkpoint_files.CheckpointError(
                        f"{locations[(layer, e, part)].path}: "
                        f"{checkpoint_files.non_finite_message(name, found, tensor.numel(), tensor.dtype)}")

    def _map_views(self, locations) -> None:
        """Zero-copy views; each expert is checked finite when first used (see ``weights``)."""
        files = {}
        self._locations = locations
        self._checked = [[False] * self.num_experts for _ in self.layer_ids]
        h, i = self.hidden, self.inter
        for layer in self.layer_ids:
            per_layer = []
            for e in range(self.num_experts):
                parts = []
                for part in PARTS:
                    loc = locations[(layer, e, part)]
                    _check_shape(loc, part, h, i, layer, e)
                    if loc.path not in files:
                        files[loc.path] = torch.from_file(loc.path, shared=False, size=os.path.getsize(loc.path),
                                                          dtype=torch.uint8)
                    raw = files[loc.path][loc.offset : loc.offset + loc.nbytes]
                    parts.append(raw.view(loc.dtype).view(loc.shape).to(self.dtype))
                per_layer.append(tuple(parts))
            self.views.append(per_layer)

    def weights(self, layer: int, expert: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(gate [I,H], up [I,H], down [H,I]) of an expert, on the host."""
        if self.mode == "mmap":
            views = self.views[layer][expert]
            if not self._checked[layer][expert]:
                # Reading every mapped byte at load would defeat mmap; the first use pays instead.
                if any(checkpoint_files.first_non_finite(v) is not None for v in views):
                    self._raise_non_finite(self.layer_ids[layer], self._locations, [(expert, views)])
                self._checked[layer][expert] = True
            return views
        return split_expert(self.buffers[layer][expert], self.hidden, self.inter)

    def grouped_views(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The layer's experts as grouped-GEMM weights ``gate_up [E, 2I, H]``, ``down [E, H, I]`` (pinned only)."""
        if self.mode != "pinned":
            return None
        buf, h, i = self.buffers[layer], self.hidden, self.inter
        return buf[:, : 2 * i * h].view(self.num_experts, 2 * i, h), buf[:, 2 * i * h :].view(self.num_experts, h, i)

    def flat(self, layer: int, expert: int) -> torch.Tensor | None:
        """The expert as one contiguous row (pinned layout only)."""
        return self.buffers[layer][expert] if self.mode == "pinned" else None

    def host_bytes(self) -> int:
        return len(self.layer_ids) * self.num_experts * self.expert_bytes

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Official tensor names for every stored expert (for ``save_pretrained``)."""
        out = {}
        for m, layer in enumerate(self.layer_ids):
            for e in range(self.num_experts):
                for part, tensor in zip(PARTS, self.weights(m, e)):
                    out[f"model.layers.{layer}.mlp.experts.{e}.{part}.weight"] = tensor
        return out


def _unpin(pin: Any, ptrs: list[int]) -> None:
    for ptr in ptrs:
        pin.unregister(ptr)


def split_expert(row: torch.Tensor, hidden: int, inter: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n = hidden * inter
    return row[:n].view(inter, hidden), row[n : 2 * n].view(inter, hidden), row[2 * n :].view(hidden, inter)


def _check_shape(loc: ExpertLocation, part: str, h: int, i: int, layer: int, e: int) -> None:
    want = (h, i) if part == "down_proj" else (i, h)
    if loc.shape != want:
        raise checkpoint_files.CheckpointError(
            f"{loc.path}: tensor model.layers.{layer}.mlp.experts.{e}.{part}.weight has shape {list(loc.shape)} "
            f"but the model built from config.json expects {list(want)} (hidden_size x moe_intermediate_size); "
            "the checkpoint and config.json disagree")


def _read_into(loc: ExpertLocation, dst: torch.Tensor) -> None:
    """Read one tensor's bytes from its shard into ``dst`` (converting dtype if they differ)."""
    if loc.dtype == dst.dtype:
        target = dst.view(torch.uint8)
    else:
        target = torch.empty(loc.nbytes, dtype=torch.uint8)
    with open(loc.path, "rb") as f:
        f.seek(loc.offset)
        got = f.readinto(memoryview(target.numpy()))
    if got != loc.nbytes:
        raise ValueError(f"{Path(loc.path).name} is truncated: read {got} of {loc.nbytes} bytes at {loc.offset}")
    if loc.dtype != dst.dtype:
        dst.copy_(target.view(loc.dtype).view(-1))
