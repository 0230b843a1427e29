"""The expert-cache budget flags, ``--cache-size`` / ``--cache-ratio`` / ``--max-gpu-memory`` /
``--gpu-memory-utilization``, for every command that loads an offloaded model.

One registration (:func:`add_budget_arguments`) and one reader (:func:`budget_fields`, through
:func:`budget_choices` for flags) so that ``serve``, ``chat``, ``benchmark``, ``demo``, ``eval``
and lm-eval's ``--model_args`` (``cache_ratio=auto``, ``max_gpu_memory=20GiB``,
``gpu_memory_utilization=0.85``: ``evaluation/lm_eval_adapter``) spell, check and explain them
alike: ``--cache-ratio`` takes a fraction or ``auto`` (sized from free GPU memory),
``--max-gpu-memory`` a size as accelerate's ``max_memory`` takes it (``20GiB``, ``20GB``,
``500MiB`` or bytes; a byte cap, so any device), ``--gpu-memory-utilization`` vLLM's fraction of
the GPU's memory the process may use for weights, activations/KV and the expert cache (it sizes
the cache as ``--cache-ratio auto`` does, which it implies). A typo is an argparse error naming
the flag; a value out of range is a one-line error naming the flag (or field), raised by
:func:`budget_fields` before any model loads (``OffloadConfig`` checks the same ranges again, by
field name, for Python callers).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

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
                        "(default: serve's --max-batch-size, eval's --batch-size, else 1)")
    p.add_argument("--auto-context-length", type=int, default=None,
                   help="with --cache-ratio auto: prompt + new tokens to reserve for "
                        "(default: --max-model-len where given, eval's max_length, else the model's "
                        "max_position_embeddings)")


@dataclass(frozen=True)
class Spelling:
    """How the user wrote the budget, so each error names what they typed: command-line flags
    (``--cache-ratio 0``) or lm-eval's ``--model_args`` fields (``cache_ratio=0``)."""

    flags: bool = True

    def name(self, field: str) -> str:
        return "--" + field.replace("_", "-") if self.flags else field

    def given(self, field: str, value: Any) -> str:
        text = format(value, "g") if isinstance(value, float) else str(value)
        return f"{self.name(field)} {text}" if self.flags else f"{field}={text}"


FLAGS, MODEL_ARGS = Spelling(flags=True), Spelling(flags=False)
BUDGET_FIELDS = ("cache_size", "cache_ratio", "max_gpu_memory")  # OffloadConfig takes exactly one
BUDGET_KEYS = (*BUDGET_FIELDS, "gpu_memory_utilization", "auto_batch_size", "auto_context_length")


def budget_choices(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The ``OffloadConfig`` budget fields each given flag asks for ([] = no offloading).

    ``--auto-batch-size`` / ``--auto-context-length`` default to the command's own
    ``--max-batch-size`` / ``--max-model-len`` where it has them; the rest is :func:`budget_fields`.
    """
    values = {key: getattr(args, key, None) for key in (*BUDGET_FIELDS, "gpu_memory_utilization")}
    return budget_fields({**values, "auto_batch_size": _auto_batch_size(args),
                          "auto_context_length": _auto_context(args)}, FLAGS)


def budget_fields(values: dict[str, Any], spell: Spelling = FLAGS) -> list[dict[str, Any]]:
    """The one reader of a budget (flags or lm-eval model_args alike): ``OffloadConfig`` fields per budget.

    More than one of the budgets is refused (naming them), as ``OffloadConfig`` refuses more than
    one; a list of ``cache_size`` values gives one entry each. ``gpu_memory_utilization`` alone
    means ``cache_ratio="auto"`` with that fraction (vLLM's meaning); beside a fixed budget it
    would be ignored (only ``auto`` reads it), so that is refused too. Ranges are checked here,
    named as ``spell`` writes them, so that a bad value is one line before any model loads.
    """
    given = [key for key in BUDGET_FIELDS if values.get(key) is not None]
    if len(given) > 1:
        names = [spell.name(key) for key in BUDGET_FIELDS]
        raise ValueError(f"give one of {names[0]}, {names[1]} or {names[2]}, "
                         f"not {' and '.join(spell.name(key) for key in given)}")
    utilization = values.get("gpu_memory_utilization")
    if utilization is not None:
        said = spell.given("gpu_memory_utilization", utilization)
        if given and (given[0] != "cache_ratio" or values["cache_ratio"] != "auto"):
            raise ValueError(f"{said} sizes the expert cache from the device (as {spell.given('cache_ratio', 'auto')} "
                             f"does), so it cannot be combined with {spell.name(given[0])}: give one of them")
        if not _is_real(utilization) or not 0.0 < utilization <= 1.0:
            raise ValueError(f"{said} is invalid: must be more than 0 and at most 1 "
                             "(the fraction of the GPU's memory this process may use)")
    _check_ranges(values, spell)
    extra = {"auto_batch_size": values.get("auto_batch_size") or 1,
             "auto_context_length": values.get("auto_context_length")}
    sizes = values.get("cache_size")
    if sizes is not None:
        return [{"cache_size": size, **extra} for size in (sizes if isinstance(sizes, list) else [sizes])]
    if utilization is not None:
        return [{"cache_ratio": "auto", "gpu_memory_utilization": utilization, **extra}]
    return [{key: values[key], **extra} for key in given]


def budget_name(budget: dict[str, Any]) -> str:
    """``cache ratio 0.4``, ``max gpu memory 20GiB``, ``cache ratio auto (gpu memory utilization 0.85)``."""
    key = next(k for k in BUDGET_FIELDS if budget.get(k) is not None)
    utilization = budget.get("gpu_memory_utilization")
    return f"{key.replace('_', ' ')} {budget[key]}" + (
        f" (gpu memory utilization {utilization:g})" if utilization is not None else "")


def _is_real(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _check_ranges(values: dict[str, Any], spell: Spelling) -> None:
    sizes = values.get("cache_size")
    for size in sizes if isinstance(sizes, list) else [sizes]:
        if size is not None and (not isinstance(size, Integral) or isinstance(size, bool) or size < 1):
            raise ValueError(f"{spell.given('cache_size', size)} is invalid: must be at least 1 expert slot per "
                             "MoE layer")
    ratio = values.get("cache_ratio")
    if ratio is not None and ratio != "auto" and (not _is_real(ratio) or not 0.0 < ratio <= 1.0):
        raise ValueError(f"{spell.given('cache_ratio', ratio)} is invalid: must be more than 0 and at most 1, or auto")
    if values.get("max_gpu_memory") is not None:
        from ..offload.budget import parse_memory

        parse_memory(values["max_gpu_memory"], spell.name("max_gpu_memory"))
    for key in ("auto_batch_size", "auto_context_length"):
        value = values.get(key)
        if value is not None and (not isinstance(value, Integral) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{spell.given(key, value)} is invalid: must be at least 1")


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
