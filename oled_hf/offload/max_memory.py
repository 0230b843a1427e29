"""accelerate's ``max_memory`` beside ``offload_config``, resolved when the model loads (``OffloadConfig.attach``).

A Transformers user sizes a load with ``max_memory={0: "20GiB", "cpu": "60GiB"}``; with offloading
the same dict means:

* the device entry is the device's whole budget, non-expert weights included. Alone it is the
  expert budget: the slot pool gets what the non-expert weights leave of it
  (``max_gpu_memory = entry - non-expert bytes``); beside a budget (``cache_size``, ``cache_ratio``,
  ``max_gpu_memory``) it caps it, and a pool that would pass it is refused;
* the ``"cpu"`` entry caps host memory. The store holds one host copy of every routed expert
  (``store="pinned"``), unless that would pass the cap: then ``store="auto"`` reads the experts from
  the shard files instead (``store="mmap"``: page cache, which the kernel reclaims), and
  ``store="pinned"`` is refused. On a CPU device the non-expert weights and the slot pool live in
  host memory too, and count against it.

Why at load: the non-expert weights' size is known once the model is built. The result is a plain
config (``max_memory`` consumed into ``max_gpu_memory`` and ``store``), so the runtime reads no
``max_memory``.
"""

from __future__ import annotations

import copy
import itertools
import logging
from dataclasses import dataclass
from typing import Any

import torch

from .budget import MaxMemory, expert_bytes, format_bytes

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadSizes:
    """What the entries are checked against, in bytes: the loaded model's non-expert weights, one routed
    expert, all of them, and the MoE shape."""

    weights: int
    one_expert: int
    layers: int
    experts: int

    @property
    def routed(self) -> int:
        return self.layers * self.experts * self.one_expert


def resolve_max_memory(config: Any, model: Any, dtype: torch.dtype | None) -> Any:
    """``config`` with its ``max_memory`` turned into the budget and store it means for ``model`` (see above).

    ``config`` is an ``OffloadConfig`` (not imported: the config imports this module); a copy is
    returned, never ``config`` changed (it may load several models); ValueError when the entries
    cannot hold what they must, naming the entry, the sizes and what to change.
    """
    entries: MaxMemory = config.max_memory_entries()
    if entries == MaxMemory():
        return config
    cfg = model.config
    weight_dtype = dtype or next(model.parameters()).dtype
    sizes = LoadSizes(
        weights=sum(t.numel() * t.element_size() for t in itertools.chain(model.parameters(), model.buffers())),
        one_expert=expert_bytes(cfg.hidden_size, cfg.moe_intermediate_size,
                                torch.empty((), dtype=weight_dtype).element_size()),
        layers=len(list(model.moe_blocks())), experts=int(cfg.num_experts))
    device = torch.device(model.device)
    resolved = copy.copy(config)  # not dataclasses.replace: that would validate (and warn) a second time
    resolved.max_memory = None
    if entries.device is not None:
        resolved.max_gpu_memory = device_budget(config, entries, device, sizes)
    if entries.cpu_bytes is not None:
        resolved.store = host_store(config, entries.cpu_bytes, device, sizes)
    return resolved


def device_budget(config: Any, entries: MaxMemory, device: torch.device, sizes: LoadSizes) -> int | str | None:
    """The config's ``max_gpu_memory`` under a device entry: the room the entry leaves where it is the budget;
    else the config's own, once its pool is checked to fit that room."""
    entry = f"max_memory's {entries.device} entry ({format_bytes(entries.device_bytes)})"
    if device.type != "cuda" or entries.device != f"cuda:{device.index or 0}":
        raise ValueError(f"{entry} names a device the model is not on: device_map put the non-expert weights on "
                         f"{device}; name that device in max_memory, or load the model there (device_map="
                         f"{entries.device!r})")
    room = entries.device_bytes - sizes.weights
    least = sizes.layers * config.min_slots_per_layer * sizes.one_expert
    if room < least:
        raise ValueError(f"{entry} leaves {format_bytes(max(room, 0))} for the expert cache after the non-expert "
                         f"weights ({format_bytes(sizes.weights)}), less than its minimum: min_slots_per_layer="
                         f"{config.min_slots_per_layer} x {sizes.layers} MoE layers x {format_bytes(sizes.one_expert)}"
                         f" = {format_bytes(least)}; raise the entry")
    pool = fixed_pool_bytes(config, sizes)
    if pool is None:
        return room  # the entry is the budget
    if pool > room:
        raise ValueError(f"{config.budget_text()} needs {format_bytes(pool)} for the expert cache and the non-expert "
                         f"weights take {format_bytes(sizes.weights)}: {format_bytes(pool + sizes.weights)} in all, "
                         f"more than {entry}; lower the budget, raise the entry, or drop the budget (the entry "
                         "alone sizes the cache)")
    return config.max_gpu_memory


def fixed_pool_bytes(config: Any, sizes: LoadSizes) -> int | None:
    """The slot pool's bytes under the config's own budget; None where it has none or sizes it from the device."""
    if config.auto or all(getattr(config, name) is None for name in ("cache_size", "cache_ratio", "max_gpu_memory")):
        return None
    return config.resolve_slots(sizes.layers, sizes.experts, expert_bytes=sizes.one_expert) * sizes.one_expert


def host_store(config: Any, cap: int, device: torch.device, sizes: LoadSizes) -> str:
    """The store under a ``"cpu"`` entry: the config's where a host copy of the experts fits it, else ``mmap``."""
    entry = f"max_memory['cpu'] ({format_bytes(cap)})"
    held = 0  # what lives in host memory whatever the store: on a CPU device, the weights and the slot pool
    if device.type == "cpu":
        pool = fixed_pool_bytes(config, sizes) or 0  # 'auto' is sized (and refused on a CPU) by the runtime
        held = sizes.weights + pool
        if held > cap:
            raise ValueError(f"on the CPU the non-expert weights ({format_bytes(sizes.weights)}) and the expert cache "
                             f"({format_bytes(pool)}) live in host memory, {format_bytes(held)} in all, more than "
                             f"{entry}; lower the budget or raise the entry")
    if config.store == "mmap" or held + sizes.routed <= cap:
        return config.store
    if config.store == "pinned":
        raise ValueError(f"store='pinned' holds every routed expert in host memory ({format_bytes(sizes.routed)}"
                         f"{f' beside {format_bytes(held)}' if held else ''}), more than {entry}; use store='mmap' "
                         "(the experts are read from the checkpoint's files) or raise the entry")
    logger.warning("the routed experts (%s) do not fit %s beside what else the host holds (%s): using store='mmap' "
                   "(read from the checkpoint's files, page cache the kernel reclaims)",
                   format_bytes(sizes.routed), entry, format_bytes(held))
    return "mmap"
