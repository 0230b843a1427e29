"""The expert-cache budget flags, ``--cache-size`` / ``--cache-ratio`` / ``--max-gpu-memory`` /
``--gpu-memory-utilization``, for every command that loads an offloaded model.

One registration (:func:`add_budget_arguments`) and one reader (:func:`budget_choices`) so that
``serve``, ``chat`` and ``benchmark`` spell, check and explain them alike: ``--cache-ratio`` takes a
fraction or ``auto`` (sized from free GPU memory), ``--max-gpu-memory`` a size as accelerate's
``max_memory`` takes it (``20GiB``, ``20GB``, ``500MiB`` or bytes), ``--gpu-memory-utilization``
vLLM's fraction of the GPU's memory the process may use for weights, activations/KV and the expert
cache (it sizes the cache as ``--cache-ratio auto`` does, which it implies). A typo is an argparse
error naming the flag; a value out of range is a one-line error naming the flag, raised by
:func:`budget_choices` before any model loads (``OffloadConfig`` checks the same ranges again, by
field name, for Python callers).
"""

from __future__ import annotations

import argparse
from typing import Any

BUDGET_FLAGS = ("--cache-size", "--cache-ratio", "--max-gpu-memory")
UTILIZATION_FLAG = "--gpu-memory-utilization"  # a budget too: --cache-ratio auto with this fraction
ANY_BUDGET = "--cache-size, --cache-ratio, --max-gpu-memory or --gpu-memory-utilization"


def cache_ratio_arg(text: str) -> float | str:
    """``--cache-ratio``: ``auto`` or a number (its range is checked by OffloadConfig)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a fraction of routed-expert bytes in (0, 1] or 'auto'") from None


def memory_arg(text: str) -> int | str:
    """``--max-gpu-memory``: a size accelerate's ``max_memory`` accepts; kept as written (reports show it)."""
    from ..offload.budget import parse_memory

    value: int | str = int(text) if text.strip().isdigit() else text
    try:
        parse_memory(value, "--max-gpu-memory")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return value


def add_budget_arguments(p: argparse.ArgumentParser, *, several_sizes: bool = False,
                         default: str = "off, every expert resident") -> None:
    """Register the three budget flags; ``several_sizes``: ``--cache-size N [N ...]`` (a sweep)."""
    p.add_argument("--cache-size", type=int, nargs="+" if several_sizes else None, default=None,
                   help="offload experts, keeping this many expert slots per MoE layer on the device"
                        f"{', several allowed' if several_sizes else ''} (default: {default})")
    p.add_argument("--cache-ratio", type=cache_ratio_arg, default=None, metavar="RATIO",
                   help="offload experts, keeping this fraction (0 < RATIO <= 1) of routed-expert bytes on the "
                        "device, or 'auto': as many as free GPU memory holds after the weights, activations and KV "
                        "for --auto-batch-size x --auto-context-length, keeping 1 - --gpu-memory-utilization "
                        f"(10%%) of the device free (instead of --cache-size; default: {default})")
    p.add_argument("--max-gpu-memory", type=memory_arg, default=None, metavar="SIZE",
                   help="offload experts, with at most this many device bytes for them: 20GiB, 20GB, 500MiB or "
                        f"bytes, as accelerate's max_memory (instead of --cache-size; default: {default})")
    p.add_argument(UTILIZATION_FLAG, type=float, default=None, metavar="F",
                   help="as vLLM's: the fraction (0 < F <= 1) of the GPU's memory this process may use for "
                        "weights, activations and KV, and the expert cache, which gets the rest (implies "
                        "--cache-ratio auto; a CUDA device is needed; default: 0.9 with --cache-ratio auto)")
    p.add_argument("--auto-batch-size", type=int, default=None,
                   help="with --cache-ratio auto: sequences decoded at once, to reserve activations and KV for "
                        "(default: the command's --max-batch-size where it has one, else 1)")
    p.add_argument("--auto-context-length", type=int, default=None,
                   help="with --cache-ratio auto: prompt + new tokens to reserve for "
                        "(default: the command's --max-model-len where given, else the model's "
                        "max_position_embeddings)")


def budget_choices(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The ``OffloadConfig`` budget fields each given flag asks for ([] = no offloading).

    More than one of the budgets is refused (naming the flags), as ``OffloadConfig`` refuses more
    than one; ``--cache-size`` with several values gives one entry each. ``--gpu-memory-utilization``
    alone means ``--cache-ratio auto`` with that fraction; beside a fixed budget it would be ignored
    (only ``auto`` reads it), so that is refused too. Ranges are checked here, naming the flag, so
    that a bad value is one line before any model loads.
    """
    given = [flag for flag in BUDGET_FLAGS if getattr(args, flag[2:].replace("-", "_"), None) is not None]
    if len(given) > 1:
        raise ValueError(f"give one of --cache-size, --cache-ratio or --max-gpu-memory, not {' and '.join(given)}")
    utilization = getattr(args, "gpu_memory_utilization", None)
    if utilization is not None:
        if given and (given[0] != "--cache-ratio" or args.cache_ratio != "auto"):
            raise ValueError(f"{UTILIZATION_FLAG} {utilization:g} sizes the expert cache from the device (as "
                             f"--cache-ratio auto does), so it cannot be combined with {given[0]}: give one of them")
        if not 0.0 < utilization <= 1.0:
            raise ValueError(f"{UTILIZATION_FLAG} {utilization:g} is invalid: must be more than 0 and at most 1 "
                             "(the fraction of the GPU's memory this process may use)")
    _check_ranges(args)
    extra: dict[str, Any] = {"auto_batch_size": _auto_batch_size(args), "auto_context_length": _auto_context(args)}
    if args.cache_size is not None:
        sizes = args.cache_size if isinstance(args.cache_size, list) else [args.cache_size]
        return [{"cache_size": size, **extra} for size in sizes]
    if utilization is not None:
        return [{"cache_ratio": "auto", "gpu_memory_utilization": utilization, **extra}]
    if args.cache_ratio is not None:
        return [{"cache_ratio": args.cache_ratio, **extra}]
    if args.max_gpu_memory is not None:
        return [{"max_gpu_memory": args.max_gpu_memory, **extra}]
    return []


def _check_ranges(args: argparse.Namespace) -> None:
    sizes = args.cache_size if isinstance(args.cache_size, list) else [args.cache_size]
    bad = next((s for s in sizes if s is not None and s < 1), None)
    if bad is not None:
        raise ValueError(f"--cache-size {bad} is invalid: must be at least 1 expert slot per MoE layer")
    ratio = args.cache_ratio
    if ratio is not None and ratio != "auto" and not 0.0 < ratio <= 1.0:
        raise ValueError(f"--cache-ratio {ratio:g} is invalid: must be more than 0 and at most 1, or auto")
    for flag in ("--auto-batch-size", "--auto-context-length"):
        value = getattr(args, flag[2:].replace("-", "_"), None)
        if value is not None and value < 1:
            raise ValueError(f"{flag} {value} is invalid: must be at least 1")


def _auto_batch_size(args: argparse.Namespace) -> int:
    """``--auto-batch-size``, else the command's own ``--max-batch-size`` (serve reserves KV for full batches)."""
    if args.auto_batch_size is not None:
        return int(args.auto_batch_size)
    batch = getattr(args, "max_batch_size", None)
    return int(batch) if isinstance(batch, int) and batch >= 1 else 1


def _auto_context(args: argparse.Namespace) -> int | None:
    """``--auto-context-length``, else the command's ``--max-model-len`` (None: the model's positions)."""
    if args.auto_context_length is not None:
        return int(args.auto_context_length)
    limit = getattr(args, "max_model_len", None)
    return int(limit) if isinstance(limit, int) and limit >= 1 else None


def check_budget_device(budgets: list[dict[str, Any]], device: str) -> None:
    """Refuse ``--cache-ratio auto`` on a device it cannot size, before any model is loaded.

    The load would refuse it too (``OffloadConfig.resolve_device_slots``), but only after a
    command has loaded its resident reference model.
    """
    if any(b.get("cache_ratio") == "auto" for b in budgets):
        from ..offload.budget import device_memory

        device_memory(device)  # raises the one message where there is no CUDA device
