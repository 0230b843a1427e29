"""Device budgets for the expert slot pool: byte sizes, the activation estimate, ``cache_ratio="auto"``.

Three ways to say how many routed-expert bytes the device keeps (``OffloadConfig``): slots per
layer (``cache_size``), a fraction of all expert bytes (``cache_ratio``), or bytes
(``max_gpu_memory``, accelerate's ``max_memory`` spellings: ``20GiB``, ``20GB``, ``500MiB`` or an
int of bytes, parsed by accelerate's own ``convert_file_size_to_int``). ``cache_ratio="auto"`` sizes
the pool from the device as vLLM sizes its KV cache (``--gpu-memory-utilization``)::

    experts_bytes = free + reclaimable - (1 - gpu_memory_utilization) * total - activations
    slots         = min(experts_bytes // expert_bytes, all experts)

``free, total = torch.cuda.mem_get_info(device)``; ``reclaimable`` is what PyTorch's caching
allocator holds but no tensor uses (``memory_reserved - memory_allocated``), which the next
allocation reuses. ``auto`` runs when ``from_pretrained`` has put the non-expert weights on the
device, so they (and whatever else is on the device, other processes too) are already in
``total - free``: the process's device use stays under ``gpu_memory_utilization`` of the total,
0.9 by default as in vLLM, i.e. 10% of the device is kept free. ``activations`` is
:func:`activation_bytes`. Fewer slots than ``min_slots_per_layer`` per layer is refused with a
message naming free memory, what is needed and what to change; nothing is enlarged.

The functions here are pure (numbers in, numbers out) except :func:`device_memory`, the one place
that asks the device, so the sizing is tested with plain numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral
from typing import Any

GIB = 1 << 30
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default: keep 10% of the device free
MAX_MEMORY_BYTES = 2**63 - 1  # a size torch (int64) can count; sizes past it are typos or "inf"
DEFAULT_BLOCK_LENGTH = 32  # logits are kept for one block per forward (the decoder's default block)


def parse_memory(value: Any, field: str = "max_gpu_memory") -> int:
    """Bytes from an int or a string with a unit, as accelerate's ``max_memory`` takes them.

    ``"20GiB"`` is 20 * 2**30, ``"20GB"`` 20 * 10**9 (accelerate's rule), ``"500MiB"``, or an int of
    bytes. Uses ``accelerate.utils.convert_file_size_to_int`` so the spellings are exactly accelerate's;
    anything else, or a size that is not > 0, raises naming ``field``.
    """
    from accelerate.utils import convert_file_size_to_int

    allowed = "an int of bytes > 0 or a size string such as '20GiB', '20GB' or '500MiB'"
    if isinstance(value, bool) or not isinstance(value, (Integral, str)):
        raise ValueError(f"{field}={value!r} is invalid: must be {allowed}")
    try:  # "infGiB" / "1e400GiB" overflow inside accelerate (int of an infinite float)
        size = int(convert_file_size_to_int(value.strip() if isinstance(value, str) else int(value)))
    except (ValueError, TypeError, OverflowError):
        raise ValueError(f"{field}={value!r} is invalid: must be {allowed}") from None
    if size <= 0:
        raise ValueError(f"{field}={value!r} is invalid: must be {allowed}")
    if size > MAX_MEMORY_BYTES:
        raise ValueError(f"{field}={value!r} is invalid: {size:.3g} bytes is more than any device holds (at most "
                         f"{MAX_MEMORY_BYTES} bytes, 2**63 - 1, what a tensor's size can count)")
    return size


@dataclass(frozen=True)
class MaxMemory:
    """accelerate's ``max_memory`` as offloading reads it: at most one device entry, and the host's.

    ``device``: the device entry's device (``cuda:0``; an int key is a CUDA ordinal, as accelerate reads
    it) or None; ``device_bytes``: the device's whole budget, non-expert weights included;
    ``cpu_bytes``: the cap on host memory (the store, and on a CPU device the weights and cache too).
    """

    device: str | None = None
    device_bytes: int | None = None
    cpu_bytes: int | None = None


def parse_max_memory(value: Any, field: str = "max_memory") -> MaxMemory:
    """accelerate's ``max_memory`` dict (``{0: "20GiB", "cpu": "60GiB"}``), checked: one line naming what is wrong.

    Keys: a CUDA ordinal (an int, or its digits after a JSON round trip), ``"cuda"``, ``"cuda:N"`` or
    ``"cpu"``; ``"disk"`` is refused (offloaded experts stay in the safetensors files, ``store='mmap'``),
    and so is more than one device (an offloaded model runs on one). Values: :func:`parse_memory`'s sizes.
    """
    allowed = "keys: a CUDA device (0, 'cuda:0') or 'cpu'; values: sizes such as '20GiB' or ints of bytes"
    if not isinstance(value, dict) or not value:
        raise ValueError(f"{field}={value!r} is invalid: must be a non-empty dict, as accelerate's ({allowed})")
    devices: dict[str, int] = {}
    cpu = None
    for key, size in value.items():
        name = max_memory_device(key)
        if name is None:
            hint = (" (with offload_config the experts stay in the checkpoint's files: store='mmap')"
                    if key == "disk" else "")
            raise ValueError(f"{field} key {key!r} is invalid{hint}; {allowed}")
        parsed = parse_memory(int(size) if isinstance(size, str) and size.strip().isdigit() else size,
                              f"{field}[{key!r}]")
        if name == "cpu":
            cpu = parsed
        else:
            devices[name] = parsed
    if len(devices) > 1:
        raise ValueError(f"{field}={value!r} names {len(devices)} devices ({', '.join(sorted(devices))}): an "
                         "offloaded model runs on one device; give its entry and 'cpu'")
    device, device_bytes = next(iter(devices.items()), (None, None))
    return MaxMemory(device, device_bytes, cpu)


def max_memory_device(key: Any) -> str | None:
    """A ``max_memory`` key as a device name (``0`` / ``"0"`` / ``"cuda"`` -> ``cuda:0``), None if not one."""
    if isinstance(key, bool):
        return None
    if isinstance(key, Integral) or (isinstance(key, str) and key.isdigit()):
        return f"cuda:{int(key)}" if int(key) >= 0 else None
    if key == "cpu":
        return "cpu"
    if key == "cuda":
        return "cuda:0"
    if isinstance(key, str) and key.startswith("cuda:") and key[5:].isdigit():
        return f"cuda:{int(key[5:])}"
    return None


def format_bytes(n: float) -> str:
    """``12.3 GiB`` / ``512.0 MiB``: sizes in messages, in the binary units the device reports."""
    for unit, scale in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def expert_bytes(hidden_size: int, moe_intermediate_size: int, dtype_bytes: int) -> int:
    """One routed expert's (gate, up, down) bytes: one slot of the pool (``ExpertStore.expert_bytes``)."""
    return 3 * int(hidden_size) * int(moe_intermediate_size) * int(dtype_bytes)


def activation_bytes(model_config: Any, batch_size: int, context_length: int, dtype_bytes: int,
                     block_length: int = DEFAULT_BLOCK_LENGTH) -> int:
    """Device bytes for decoding ``batch_size`` sequences of ``context_length`` tokens (an estimate).

    With ``B`` = batch, ``S`` = context (prompt + new tokens), ``d`` = dtype bytes, per the config::

        KV cache     2 * num_hidden_layers * B * S * num_key_value_heads * head_dim * d
        widest pass  B * S * (d * (4*H + (heads + 2*kv_heads) * head_dim
                               + max(2 * intermediate_size, k * (3*I + H) + shared * 3*I))
                              + 4 * num_experts)
        logits       2 * B * block_length * vocab_size * 4        (float32 logits and their softmax)
        scores       B * heads * S * S * d                        (only with attn_implementation="eager")

    The widest pass is the prefill forward over the whole prompt: residual, norm and attention
    outputs (4H), q/k/v, the larger of a dense MLP and the routed experts' grouped GEMM (gate/up
    and down outputs of ``k`` experts per token, plus the shared experts), and float32 router
    scores. Logits are computed for one block only (``logits_to_keep``). SDPA's fused kernels do
    not materialise the ``S x S`` scores, so they count only for eager attention.
    """
    c = model_config
    B, S, d = int(batch_size), int(context_length), int(dtype_bytes)
    H, heads = int(c.hidden_size), int(c.num_attention_heads)
    kv_heads = int(getattr(c, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(c, "head_dim", None) or H // heads)
    inter, moe_inter = int(c.intermediate_size), int(c.moe_intermediate_size)
    k, shared = int(c.num_experts_per_tok), int(getattr(c, "num_shared_experts", 0) or 0)
    kv = 2 * int(c.num_hidden_layers) * B * S * kv_heads * head_dim * d
    mlp = max(2 * inter, k * (3 * moe_inter + H) + shared * 3 * moe_inter)
    per_token = d * (4 * H + (heads + 2 * kv_heads) * head_dim + mlp) + 4 * int(c.num_experts)
    logits = 2 * B * min(int(block_length), S) * int(c.vocab_size) * 4
    scores = B * heads * S * S * d if getattr(c, "_attn_implementation", None) == "eager" else 0
    return kv + B * S * per_token + logits + scores


def slots_for_bytes(budget_bytes: int, one_expert_bytes: int, num_layers: int, num_experts: int) -> int:
    """Whole slots that fit in ``budget_bytes``, at most every expert of every layer (never more is useful)."""
    return max(0, min(int(budget_bytes) // int(one_expert_bytes), int(num_layers) * int(num_experts)))


def auto_slots(*, free_bytes: int, total_bytes: int, reclaimable_bytes: int, activations: int,
               one_expert_bytes: int, num_layers: int, num_experts: int, min_slots_per_layer: int,
               gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION, device: str = "cuda") -> int:
    """Slots for ``cache_ratio="auto"`` (formula in the module doc); ValueError when the minimum does not fit."""
    headroom = int(math.ceil((1.0 - float(gpu_memory_utilization)) * total_bytes))
    available = int(free_bytes) + int(reclaimable_bytes) - headroom - int(activations)
    slots = slots_for_bytes(available, one_expert_bytes, num_layers, num_experts)
    needed = int(num_layers) * int(min_slots_per_layer)
    if slots < needed:
        need_bytes = needed * int(one_expert_bytes) + int(activations) + headroom
        raise ValueError(
            f"cache_ratio='auto': {device} has {format_bytes(free_bytes + reclaimable_bytes)} free of "
            f"{format_bytes(total_bytes)}, but the smallest expert cache (min_slots_per_layer="
            f"{min_slots_per_layer} x {num_layers} MoE layers = {needed} slots of {format_bytes(one_expert_bytes)}) "
            f"plus activations and KV ({format_bytes(activations)}) plus headroom "
            f"({1.0 - float(gpu_memory_utilization):.0%} of the device, {format_bytes(headroom)}) needs "
            f"{format_bytes(need_bytes)}; free device memory, lower auto_batch_size / auto_context_length, "
            "raise gpu_memory_utilization, or give a fixed budget (cache_size=N or max_gpu_memory='...')"
        )
    return slots


def device_memory(device: Any) -> tuple[int, int, int]:
    """``(free, total, reclaimable)`` bytes of a CUDA device; ValueError where there is none to ask.

    ``reclaimable`` is PyTorch's cached-but-unused memory (``memory_reserved - memory_allocated``):
    ``mem_get_info`` counts it as used, yet the pool allocation will reuse it.
    """
    import torch

    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        raise ValueError(
            f"cache_ratio='auto' needs a CUDA device (it sizes the expert cache from free GPU memory), "
            f"but the model is on {dev}"
            f"{'' if torch.cuda.is_available() else ' and torch.cuda.is_available() is False'}; "
            "give cache_ratio=R (fraction of routed-expert bytes in (0, 1]), cache_size=N (slots per MoE layer) "
            "or max_gpu_memory='...'"
        )
    free, total = torch.cuda.mem_get_info(dev)
    reclaimable = max(0, int(torch.cuda.memory_reserved(dev)) - int(torch.cuda.memory_allocated(dev)))
    return int(free), int(total), reclaimable
