"""Run lm-eval offline on an ``oled_llada2`` model with the repository's task folder (CLI and parity share it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


def go_offline() -> None:
    """Offline unless the caller exported otherwise; also patches modules imported before us."""
    for name in OFFLINE_VARS:
        os.environ.setdefault(name, "1")
    offline = os.environ["HF_HUB_OFFLINE"].upper() in ("1", "ON", "YES", "TRUE")
    try:
        import huggingface_hub.constants as hub_constants

        hub_constants.HF_HUB_OFFLINE = offline
    except ImportError:
        pass
    try:
        import datasets.config

        datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = (
            os.environ["HF_DATASETS_OFFLINE"].upper() in ("1", "ON", "YES", "TRUE")
        )
    except ImportError:
        pass


def parse_model_args(text: str | None) -> dict[str, Any]:
    from lm_eval.utils import simple_parse_args_string

    return simple_parse_args_string(text or "")


def make_lm(model: str, model_args: dict[str, Any] | None = None, batch_size: int = 1, device: str | None = None):
    """An ``OledLLaDA2LM`` for checkpoint ``model`` (``pretrained=`` in ``model_args`` also works)."""
    from .lm_eval_adapter import OledLLaDA2LM

    args = dict(model_args or {})
    args.setdefault("pretrained", str(model))
    args.setdefault("batch_size", batch_size)
    if device is not None:
        args.setdefault("device", device)
    return OledLLaDA2LM(**args)


def task_manager_and_specs(tasks: list[str], include_paths: list[Path], data_files: dict | None = None):
    """A TaskManager (without lm-eval's ~15k stock YAMLs when every task is ours) and the specs to load."""
    from lm_eval.tasks import TaskManager

    from .tasks import task_spec

    specs = [task_spec(name, include_paths, data_files) for name in tasks]
    ours = all(isinstance(s, dict) for s in specs)
    manager = TaskManager(include_path=[str(p) for p in include_paths], include_defaults=not ours)
    for spec in specs:
        if isinstance(spec, str) and spec not in manager.all_tasks:
            raise ValueError(f"unknown task {spec!r}: not in {', '.join(map(str, include_paths))} nor in lm-eval")
    return manager, specs


def evaluate(
    lm,
    tasks: list[str],
    *,
    include_paths: list[Path] | None = None,
    limit: int | float | None = None,
    num_fewshot: int | None = None,
    gen_kwargs: str | None = None,
    apply_chat_template: bool = False,
    log_samples: bool = False,
    data_files: dict | None = None,
    seed: int = 0,
    bootstrap_iters: int = 100000,
    quiet: bool = False,
) -> dict:
    """``lm_eval.simple_evaluate`` on ``lm``; results carry ``config.offload`` when the model offloads.

    Progress goes by :func:`.quiet.lm_eval_quiet`: bars on a terminal, lines in a pipe, none with ``quiet``.
    """
    import lm_eval

    from .quiet import lm_eval_quiet
    from .tasks import default_tasks_dir

    go_offline()
    include_paths = [Path(p).resolve() for p in (include_paths or [default_tasks_dir()])]
    manager, specs = task_manager_and_specs(tasks, include_paths, data_files)
    lm.reset_offload_stats()
    with lm_eval_quiet(quiet):
        results = lm_eval.simple_evaluate(
            model=lm, tasks=specs, task_manager=manager, limit=limit, num_fewshot=num_fewshot,
            gen_kwargs=gen_kwargs, apply_chat_template=apply_chat_template, log_samples=log_samples,
            bootstrap_iters=bootstrap_iters, random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
            fewshot_random_seed=seed,
        )
    stats = lm.offload_stats()
    if stats is not None:
        results["config"]["offload"] = stats
    return results


def format_offload(stats: dict) -> str:
    total = stats["total"]
    return (f"offloading: policy {stats['policy']}, {stats['total_slots']} slots "
            f"({stats['slots_per_layer']:.1f} per MoE layer) on {stats['device']}; "
            f"hit rate {total['hit_rate']:.3f}, {total['hits']} hits / {total['misses']} misses, "
            f"{total['evictions']} evictions, {total['bytes_copied'] / 2**20:.2f} MiB copied, "
            f"{total['cpu_expert_tokens']} CPU expert-tokens, {total['forwards']} forwards")
