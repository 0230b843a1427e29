"""Loading options that ``serve`` and ``chat`` share: :func:`add_model_arguments` and the serving flags on top.

As ``vllm serve MODEL`` does, the model may be given positionally (``--model`` is kept); ``--dtype``
and ``--max-model-len`` are added (the budget flags, ``--cache-ratio auto``, ``--max-gpu-memory``
and ``--gpu-memory-utilization`` included, are ``options.budget``'s, as every offloading command's).
``--system`` names the offloading system (the grammar of ``offload/system.py``: retention,
dispatch and allocation parts, or a preset such as ``lru-full``), as every command names it. A
prefetch part that reads predicted routes (``gate``, ``gate-capped``) or an oracle retention is
refused here: they run in replay only (the ``previous`` and ``matrix`` prefetchers run live). The
old spellings are deprecated aliases (``options.aliases``): ``--offload-system`` (the same value)
and ``--policy NAME`` (the system that name ran, e.g. ``lru+cpu+adaptive``; ``prefetch``'s gate
prefetcher reads a trace's predicted routes, which only ``oled-moe trace replay`` has).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..offload.config import KNOWN_POLICIES
from ..options.aliases import add_alias

DTYPES = ("auto", "float32", "bfloat16", "float16")
SYSTEM_HELP = ("the offloading system by its parts, e.g. lru+cpu+reuse+adaptive, or a preset such as lru-full or "
               "hybrimoe (with a budget flag; default: OffloadConfig's default system)")


def live_policy(value: str) -> tuple[str, str]:
    """``--policy NAME`` (deprecated): the system that old name runs, checked as ``--system`` is, and the advice.

    ``prefetch`` names a system whose gate prefetcher reads predicted routes only a recorded trace
    holds: refused here, as ``--system`` refuses it.
    """
    if value not in KNOWN_POLICIES:
        raise argparse.ArgumentTypeError(f"unknown policy '{value}'; the old policy names: {', '.join(KNOWN_POLICIES)}")
    from ..offload.system import spelling, system_of_legacy

    system = spelling(system_of_legacy(value))
    try:
        live_system(system)
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"'{value}' names the system {system!r}: {err}") from None
    return system, f"use --system {system} (the system --policy {value} runs)"


def live_system(value: str) -> str:
    """argparse type for ``--system``: a system a live ``generate`` can run (OffloadConfig's rules)."""
    from ..offload.system import parse_system

    try:
        parse_system(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    from ..offload.config import OffloadConfig

    try:  # every other rule of a live system (an oracle retention, ...) is OffloadConfig's, checked once there
        OffloadConfig(cache_size=1, system=value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


def add_system_argument(p: argparse.ArgumentParser, **system: Any) -> None:
    """``--system`` (a live system) and its deprecated spellings ``--offload-system`` and ``--policy``;
    ``system``: ``add_argument``'s keywords for ``--system`` where a command reads it its own way (chat)."""
    p.add_argument("--system", **{"default": None, "type": live_system, "metavar": "SYSTEM", "help": SYSTEM_HELP,
                                  **system})
    add_alias(p, "--offload-system", "--system", "system", type=live_system, metavar="SYSTEM")
    add_alias(p, "--policy", "--system", "system", convert=live_policy, metavar="POLICY",
              help="deprecated: an old retention policy name (lfu, lru, oled, static, tide, moe-infinity); use "
                   "--system (default: --system's)")


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """Loading and decoding options shared by ``chat`` and ``serve``: the model, the device, the
    budget flags every offloading command takes (``options.budget``), the policy and the decoding knobs."""
    from ..options.budget import add_budget_arguments
    from ..options.model import add_device_argument, add_model_argument

    add_model_argument(p)
    add_device_argument(p)
    add_budget_arguments(p)
    p.add_argument("--block-length", type=int, default=None,
                   help="diffusion block length (default: the checkpoint's generation_config)")
    p.add_argument("--threshold", type=float, default=None,
                   help="confidence threshold to commit a token (default: the checkpoint's generation_config)")


def add_serving_model_arguments(p: argparse.ArgumentParser, max_model_len: bool = True) -> None:
    """:func:`add_model_arguments`, the model as an optional positional, and the loading flags below.

    ``--system`` is left to the caller: serve takes :func:`add_system_argument`, chat a ``--system``
    that also reads its old meaning (the system prompt, ``cli/chat.py``).
    """
    add_model_arguments(p)
    p.add_argument("model_path", nargs="?", default=None, metavar="MODEL",
                   help="checkpoint folder, as with --model (give one or the other)")
    p.add_argument("--dtype", choices=DTYPES, default=None,
                   help="dtype to load the weights in (default: the checkpoint's)")
    if max_model_len:
        p.add_argument("--max-model-len", type=int, default=None, metavar="TOKENS",
                       help="most tokens (prompt + completion) one request may use; requests past it are refused "
                            "(default and maximum: the model's max_position_embeddings)")


def model_argument(args: argparse.Namespace) -> str | None:
    """The model folder from ``MODEL`` or ``--model``; a ValueError when both are given and differ."""
    positional, flag = getattr(args, "model_path", None), getattr(args, "model", None)
    if positional is not None and flag is not None and positional != flag:
        raise ValueError(f"the model is given twice: MODEL {positional} and --model {flag}; give one")
    return positional if positional is not None else flag


def loading_problem(args: argparse.Namespace) -> str | None:
    """Why these loading options cannot work together, or None (checked before anything is loaded)."""
    from ..options.budget import ANY_BUDGET, budget_choices

    try:
        offloading = bool(budget_choices(args))
    except ValueError as err:
        return str(err)
    if getattr(args, "system", None) is not None and not offloading:
        return f"--system needs a budget, {ANY_BUDGET} (it decides what the expert cache keeps)"
    limit = getattr(args, "max_model_len", None)
    if limit is not None and limit < 1:
        return f"--max-model-len {limit} is invalid: must be a positive number of tokens"
    return None


def max_model_len_problem(path: Path, max_model_len: int | None) -> str | None:
    """``--max-model-len`` against the checkpoint's ``max_position_embeddings`` (config.json, read before loading)."""
    if max_model_len is None:
        return None
    from .engine import max_model_len_problem as problem

    try:
        context = json.loads((Path(path) / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None  # loading will say what is wrong with the checkpoint
    return problem(max_model_len, int(context)) if isinstance(context, int) else None
