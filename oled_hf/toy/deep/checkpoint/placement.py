"""Where a loaded model's weights live and where its inputs go: accelerate's conventions, and offloading's.

Without ``offload_config`` the model follows accelerate as any Transformers model does:
``device_map`` ("auto", "balanced", a dict...), ``max_memory`` and ``offload_folder`` place and
offload its modules, and accelerate's hooks move inputs between devices and load offloaded
weights at each module's forward. Two things here make that work for this model: inputs go to
the device accelerate executes on (:func:`input_device`; ``model.device`` is ``meta`` when
weights were offloaded to disk), and routed experts whose weights are offloaded run as modules
(``experts.py``) so that the hooks load them.

With ``offload_config`` the routed experts are not modules: the ExpertStore reads them from the
checkpoint and the slot cache on the run device holds some of them, sized by the
``OffloadConfig`` budget (``cache_size``, ``cache_ratio`` or ``max_gpu_memory``). The non-expert
weights are placed by ``device_map`` on ONE device, the device the slot cache is on
(:func:`offload_placement`): an accelerate strategy ("auto", "balanced", ...) means the first
CUDA device, else the CPU; a map that spreads modules over several devices, or onto "disk", is
refused before anything loads, and so is ``offload_folder`` (disk offload of accelerate-placed
modules). ``max_memory`` is read as accelerate means it: its device entry is the device's budget,
non-expert weights included, and its cpu entry caps host memory (``oled_hf/offload/max_memory.py``).
"""

from __future__ import annotations

import importlib

import torch

ACCELERATE_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
# from_pretrained options that offload accelerate-placed modules to disk: meaningless for the expert cache
ACCELERATE_OFFLOAD_OPTIONS = ("offload_folder", "offload_state_dict", "offload_buffers")


def resolve_offload_config(value, max_memory=None):
    """An ``OffloadConfig`` (anything with ``attach``) as is; a dict of its fields built into one.

    ``max_memory``: ``from_pretrained``'s (accelerate's dict), handed to the config, which reads it
    (``with_max_memory``: the device entry is the device's budget, the cpu entry caps host memory).
    ``modeling/`` imports only torch and transformers: the config class is imported here, lazily,
    and only when a dict is given (it lives in the oled-hf package).
    """
    if isinstance(value, dict) and max_memory is not None and "max_memory" not in value:
        value, max_memory = {**value, "max_memory": max_memory}, None  # it may be the dict's only budget
    config = _build_offload_config(value)
    if max_memory is None:
        return config
    if not hasattr(config, "with_max_memory"):
        raise ValueError(f"max_memory={max_memory!r} cannot be combined with this offload_config "
                         f"({type(config).__name__} reads no max_memory); give the budget in the config")
    return config.with_max_memory(max_memory)


def _build_offload_config(value):
    """An ``OffloadConfig`` (anything with ``attach``) as is; a dict of its fields built into one."""
    if value is None or hasattr(value, "attach"):
        return value
    if isinstance(value, dict):
        try:
            module = importlib.import_module("oled_hf.offload.config")
        except ImportError as error:
            raise ImportError(
                "offload_config given as a dict is read as oled_hf.OffloadConfig(**offload_config), which needs "
                f"the oled-hf package installed ({error}); install it, or pass an OffloadConfig"
            ) from error
        return module.OffloadConfig.from_dict(value)
    raise ValueError(
        f"offload_config must be an oled_hf.OffloadConfig or a dict of its fields, got {type(value).__name__}"
    )


def _device_name(value) -> str:
    """One device of a ``device_map`` as a string: ints are CUDA ordinals, as accelerate reads them."""
    if isinstance(value, bool):
        raise ValueError(f"device_map device {value!r} is invalid: allowed a device name, a torch.device or an int")
    if isinstance(value, int):
        return f"cuda:{value}"
    name = str(value)
    return "cuda:0" if name == "cuda" else name


def _strategy_device() -> str:
    return "cuda:0" if torch.cuda.is_available() else "cpu"


def offload_placement(kwargs: dict) -> None:
    """With ``offload_config``: check and resolve the placement options of ``from_pretrained`` in place.

    Refused before loading (one line, naming OffloadConfig): the options of
    :data:`ACCELERATE_OFFLOAD_OPTIONS`, a ``device_map`` over several devices or onto "disk".
    (``max_memory`` went to the config: :func:`resolve_offload_config`.) An accelerate strategy
    string becomes the single device it stands for here (first CUDA device, else the CPU).
    """
    for name in ACCELERATE_OFFLOAD_OPTIONS:
        value = kwargs.get(name)
        if value is not None and value is not False:
            raise ValueError(
                f"{name}={value!r} cannot be combined with offload_config: it offloads modules accelerate "
                "places to disk, and the routed experts are not modules (they stay in the checkpoint's files "
                "with OffloadConfig(store='mmap')); budget the expert cache with max_memory or OffloadConfig and "
                "put the other weights on one device with device_map"
            )
    device_map = kwargs.get("device_map")
    if device_map is None:
        return
    if isinstance(device_map, str) and device_map in ACCELERATE_STRATEGIES:
        kwargs["device_map"] = _strategy_device()
        return
    values = list(device_map.values()) if isinstance(device_map, dict) else [device_map]
    devices = sorted({_device_name(v) for v in values})
    if len(devices) != 1 or devices[0] in ("disk", "meta"):
        raise ValueError(
            f"device_map={device_map!r} cannot be combined with offload_config: an offloaded model runs on one "
            f"device (here: {', '.join(devices) or 'none'}); put the non-expert weights on one device "
            "(device_map='cuda:0' or 'cpu') and size the expert cache with OffloadConfig(...)"
        )


def input_device(model) -> torch.device:
    """Where a forward's inputs go: accelerate's execution device when it dispatched the model.

    A dispatched model carries accelerate's hook on its root (``_hf_hook.execution_device``);
    ``model.device`` (its first parameter's) would be ``meta`` for weights offloaded to disk.
    """
    device = getattr(getattr(model, "_hf_hook", None), "execution_device", None)
    if device is None:
        return model.device
    return torch.device(_device_name(device))


# Host memory left free by every load: the OS, the page cache a run reads through, activations.
HOST_HEADROOM_FRACTION = 0.10
HOST_HEADROOM_MIN = 1 << 30


def host_memory() -> tuple[int, int]:
    """(available, total) bytes of host memory: ``MemAvailable`` and ``MemTotal`` of /proc/meminfo.

    MemAvailable counts the page cache the kernel can drop as available, as it should here: a
    load's own memory-mapped shards are such cache. Elsewhere (no /proc), ``sysconf`` (free pages
    only) is the fallback.
    """
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line[0].isupper()}
        return info["MemAvailable"], info["MemTotal"]
    except (OSError, KeyError, ValueError, IndexError):
        import os

        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def host_headroom(total: int) -> int:
    """Bytes a load keeps free: 10% of the host's memory, at least 1 GiB."""
    return max(int(HOST_HEADROOM_FRACTION * total), HOST_HEADROOM_MIN)


def load_headroom(needed: int, total: int) -> int:
    """Bytes a resident load of ``needed`` bytes keeps free: as much again (the shard pages read beside the
    copies), at most :func:`host_headroom`.

    Why not always the full headroom: a 10 MB model was refused on a busy host with 1.4 GiB available
    because 10% of the host (2.4 GiB) was to stay free; a load that small cannot push the host over.
    """
    return min(int(needed), host_headroom(total))


def gib(n: float) -> str:
    """``12.3 GiB``, or ``9.4 MiB`` below a GiB (a small model's size would read "0.0 GiB")."""
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def check_host_memory(tensors, device_map) -> None:
    """Refuse, before any weight is read, a load whose CPU-placed weights would not fit in host memory.

    Why: Transformers materialises every weight placed on the CPU as a tensor of its own (it reads
    the memory-mapped shards, then copies), so a checkpoint larger than RAM is killed by the OOM
    killer half-way. ``tensors``: the model's state dict as built (meta tensors: shapes and dtypes
    only); ``device_map``: the load's (None or "cpu" everywhere: every weight on the host; a map
    with other devices or disk: only the entries on "cpu" are counted by module prefix).
    """
    if isinstance(device_map, dict) and device_map:
        on_host = [p for p, d in device_map.items() if str(d) == "cpu"]
        if not on_host:
            return
        names = [n for n in tensors if any(p == "" or n == p or n.startswith(p + ".") for p in on_host)]
    elif device_map is None or str(device_map) == "cpu":
        names = list(tensors)
    else:
        return
    needed = sum(tensors[n].numel() * tensors[n].element_size() for n in names)
    available, total = host_memory()
    keep = load_headroom(needed, total)
    if needed > available - keep:
        raise ValueError(
            f"loading this checkpoint resident needs {gib(needed)} of host memory for its weights, but the host has "
            f"{gib(available)} available ({gib(keep)} kept free): load it with its routed experts offloaded, "
            "from_pretrained(path, offload_config=oled_hf.OffloadConfig(cache_ratio=0.25)) (they stay in the "
            "safetensors files with store='mmap'), or on a larger machine")
