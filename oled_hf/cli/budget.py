"""The expert-cache budget flags, ``--cache-size`` / ``--cache-ratio`` / ``--max-gpu-memory``, for every command.

One registration and one reader so that each command spells, checks and explains them alike:
``--cache-ratio`` takes a fraction or ``auto`` (sized from free GPU memory), ``--max-gpu-memory`` a
size as accelerate's ``max_memory`` takes it (``20GiB``, ``20GB``, ``500MiB`` or bytes). The range
checks are ``OffloadConfig``'s own (its errors name the field); here only the spelling is parsed,
so a typo is an argparse error naming the flag.
"""

from __future__ import annotations

import argparse
from typing import Any

BUDGET_FLAGS = ("--cache-size", "--cache-ratio", "--max-gpu-memory")


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
    p.add_argument("--cache-ratio", type=cache_ratio_arg, default=None,
                   help="offload experts, keeping this fraction of routed-expert bytes on the device, or 'auto': "
                        "as many as free GPU memory holds after the weights, activations and KV for "
                        "--auto-batch-size x --auto-context-length, keeping 10%% of the device free "
                        f"(instead of --cache-size; default: {default})")
    p.add_argument("--max-gpu-memory", type=memory_arg, default=None,
                   help="offload experts, with at most this many device bytes for them: 20GiB, 20GB, 500MiB or "
                        f"bytes, as accelerate's max_memory (instead of --cache-size; default: {default})")
    p.add_argument("--auto-batch-size", type=int, default=1,
                   help="with --cache-ratio auto: sequences decoded at once, to reserve activations and KV for")
    p.add_argument("--auto-context-length", type=int, default=None,
                   help="with --cache-ratio auto: prompt + new tokens to reserve for "
                        "(default: the model's max_position_embeddings)")


def budget_choices(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The ``OffloadConfig`` budget fields each given flag asks for ([] = no offloading).

    More than one of the three flags is refused (naming them), as ``OffloadConfig`` refuses more
    than one budget; ``--cache-size`` with several values gives one entry each.
    """
    given = [flag for flag in BUDGET_FLAGS if getattr(args, flag[2:].replace("-", "_")) is not None]
    if len(given) > 1:
        raise ValueError(f"give one of --cache-size, --cache-ratio or --max-gpu-memory, not {' and '.join(given)}")
    extra = {"auto_batch_size": args.auto_batch_size, "auto_context_length": args.auto_context_length}
    if args.cache_size is not None:
        sizes = args.cache_size if isinstance(args.cache_size, list) else [args.cache_size]
        return [{"cache_size": size, **extra} for size in sizes]
    if args.cache_ratio is not None:
        return [{"cache_ratio": args.cache_ratio, **extra}]
    if args.max_gpu_memory is not None:
        return [{"max_gpu_memory": args.max_gpu_memory, **extra}]
    return []


def check_budget_device(budgets: list[dict[str, Any]], device: str) -> None:
    """Refuse ``--cache-ratio auto`` on a device it cannot size, before any model is loaded.

    The load would refuse it too (``OffloadConfig.resolve_device_slots``), but only after a
    command has loaded its resident reference model.
    """
    if any(b.get("cache_ratio") == "auto" for b in budgets):
        from ..offload.budget import device_memory

        device_memory(device)  # raises the one message where there is no CUDA device
