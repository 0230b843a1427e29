"""Loading options that ``serve`` and ``chat`` share: :func:`add_model_arguments` and the serving flags on top.

As ``vllm serve MODEL`` does, the model may be given positionally (``--model`` is kept); ``--dtype``
and ``--max-model-len`` are added (the budget flags, ``--cache-ratio auto``, ``--max-gpu-memory``
and ``--gpu-memory-utilization`` included, are ``options.budget``'s, as every offloading command's).
``--policy`` offers only the retention policies that act in a live ``generate``: ``prefetch`` and
``moe-infinity`` copy experts ahead from a routing trace's future, which only trace replay
(``oled-moe trace replay``) has, so a live model would silently run plain LRU under their names.
``--offload-system`` names a whole system (the grammar of ``offload/system.py``: retention,
dispatch and allocation parts, or a preset such as ``lru-full``), as ``oled-moe benchmark
--system`` does; chat's ``--system`` is already the system prompt, hence the longer name. A
prefetch part that reads predicted routes (``gate``, ``gate-capped``) is refused here: it runs in replay only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..offload.config import KNOWN_POLICIES

REPLAY_ONLY_POLICIES = ("moe-infinity", "prefetch")
LIVE_POLICIES = tuple(p for p in KNOWN_POLICIES if p not in REPLAY_ONLY_POLICIES)
DTYPES = ("auto", "float32", "bfloat16", "float16")


def live_policy(value: str) -> str:
    """argparse type for ``--policy`` on live commands: a live policy, or an error saying where the others work."""
    if value in LIVE_POLICIES:
        return value
    if value in REPLAY_ONLY_POLICIES:
        raise argparse.ArgumentTypeError(
            f"'{value}' works only in trace replay (oled-moe trace replay), where the routing of later layers is "
            f"known; live policies: {', '.join(LIVE_POLICIES)}")
    raise argparse.ArgumentTypeError(f"unknown policy '{value}'; live policies: {', '.join(LIVE_POLICIES)}")


def live_system(value: str) -> str:
    """argparse type for ``--offload-system``: a system a live ``generate`` can run (OffloadConfig's rules)."""
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


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """Loading and decoding options shared by ``chat`` and ``serve``: the model, the device, the
    budget flags every offloading command takes (``options.budget``), the policy and the decoding knobs."""
    from ..options.budget import add_budget_arguments
    from ..options.model import add_device_argument, add_model_argument

    add_model_argument(p)
    add_device_argument(p)
    add_budget_arguments(p)
    p.add_argument("--policy", choices=KNOWN_POLICIES, default=None,
                   help="expert-cache retention policy (with a budget flag; default: oled)")
    p.add_argument("--block-length", type=int, default=None,
                   help="diffusion block length (default: the checkpoint's generation_config)")
    p.add_argument("--threshold", type=float, default=None,
                   help="confidence threshold to commit a token (default: the checkpoint's generation_config)")


def add_serving_model_arguments(p: argparse.ArgumentParser, max_model_len: bool = True) -> None:
    """:func:`add_model_arguments`, the model as an optional positional, and the loading flags below."""
    add_model_arguments(p)
    p.add_argument("model_path", nargs="?", default=None, metavar="MODEL",
                   help="checkpoint folder, as with --model (give one or the other)")
    policy = next((a for a in p._actions if a.dest == "policy"), None)
    if policy is None:
        p.add_argument("--policy", default=None, type=live_policy)
        policy = p._actions[-1]
    policy.choices, policy.type = None, live_policy
    policy.metavar = "{" + ",".join(LIVE_POLICIES) + "}"
    policy.help = ("expert-cache retention policy (with a budget flag; default: oled); "
                   f"{' and '.join(REPLAY_ONLY_POLICIES)} work only in trace replay")
    p.add_argument("--offload-system", default=None, type=live_system, metavar="SYSTEM",
                   help="the offloading system by its parts, e.g. lru+cpu+reuse+adaptive, or a preset such as "
                        "lru-full or hybrimoe (with a budget flag; instead of --policy; default: "
                        "none, the policy's system)")
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
    system = getattr(args, "offload_system", None)
    if args.policy is not None and system is not None:
        return "--policy and --offload-system both given: pass one (a retention policy, or a whole system)"
    for flag, value in (("--policy", args.policy), ("--offload-system", system)):
        if value is not None and not offloading:
            return f"{flag} needs a budget, {ANY_BUDGET} (it decides what the expert cache keeps)"
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
