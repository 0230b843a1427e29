"""``oled-moe eval``: lm-eval tasks on a LLaDA2 checkpoint (optionally offloaded), offline.

    oled-moe eval --model M --tasks toy_addition,toy_addition_mc [--model-args cache_size=20,system=oled]
                  [--limit N] [--batch-size B] [--output-path P] [--device auto|cpu|cuda[:N]]
                  [--cache-size N | --cache-ratio R|auto | --max-gpu-memory SIZE | --gpu-memory-utilization F]

The budget flags are serve's (the same words work in --model-args: cache_ratio=auto, ...); with
auto, KV is reserved for --batch-size sequences of the model's max_length.

lm-eval's spellings work too (--model_args pretrained=M,cache_size=20 --batch_size 4 --num_fewshot 0
--include_path DIR ...; --model oled_llada2 is accepted and means the model given by pretrained=).

The model is lm-eval's ``oled_llada2`` (``oled_hf.evaluation.lm_eval_adapter``); tasks come from the
repository's ``eval/tasks`` (plus ``--include-path``) and from lm-eval itself. The hub is off
unless HF_HUB_OFFLINE / HF_DATASETS_OFFLINE are exported as 0.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ..fileio import check_new_file, check_new_files, write_text_atomically
from ..options.budget import BUDGET_KEYS, add_budget_arguments, budget_choices
from ..options.model import add_device_argument, add_model_argument
from ..progress import add_quiet_argument
from .common import add_command, resolve_device, resolve_model

# lm-eval's name for the model this command always runs; ``--model oled_llada2`` (lm-eval's spelling,
# where --model is the model type) therefore means "the checkpoint given by pretrained=, or the default".
LM_EVAL_MODEL = "oled_llada2"


def register(sub: argparse._SubParsersAction) -> None:
    add_command(sub, "eval", "run lm-eval tasks (offline) on a checkpoint, optionally with offloaded experts",
                configure, description=__doc__)


def configure(p: argparse.ArgumentParser) -> None:
    add_model_argument(p)
    p.add_argument("--tasks", required=True, help="comma-separated task names (toy_addition, toy_addition_mc, "
                   "gsm8k_local, any lm-eval task)")
    # Each option also takes lm-eval's own spelling (--model_args, --batch_size, ...), so a
    # command line written for lm-eval works here unchanged.
    p.add_argument("--model-args", "--model_args", default="", help="k=v,... for the oled_llada2 model: "
                   "pretrained (the checkpoint, instead of --model), offloading (cache_size | cache_ratio, system, "
                   "cpu_compute, ...), decoding (block_length, threshold, steps), likelihood (mc_num, mc_seed, "
                   "mc_attention, mc_batch_size), dtype, device, max_length")
    p.add_argument("--limit", type=float, default=None, help="examples per task, a fraction if < 1 (default: all)")
    p.add_argument("--batch-size", "--batch_size", type=int, default=1,
                   help="prompts per generate call / requests per forward")
    p.add_argument("--output-path", "--output_path", default=None,
                   help="write the results as JSON: a .json file (its folder must exist), or a folder (made if its "
                        "parent exists) that gets results_MODEL_TIME.json (default: print only)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output-path .json file")
    p.add_argument("--include-path", "--include_path", action="append", default=[],
                   help="extra folder of task YAMLs (repeatable)")
    p.add_argument("--num-fewshot", "--num_fewshot", type=int, default=None,
                   help="few-shot examples (default: the task's)")
    p.add_argument("--gen-kwargs", "--gen_kwargs", default=None,
                   help="k=v,... overriding the tasks' generation_kwargs (default: none)")
    p.add_argument("--apply-chat-template", "--apply_chat_template", action="store_true",
                   help="wrap prompts in the model's chat template (stock tasks; the toy tasks embed it already)")
    p.add_argument("--log-samples", "--log_samples", action="store_true",
                   help="keep per-example outputs in --output-path")
    add_device_argument(p)
    add_budget_arguments(p, default="off, unless --model-args names a budget")
    p.add_argument("--seed", type=int, default=0, help="lm-eval's python/numpy/torch/few-shot seeds")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    add_quiet_argument(p)
    p.set_defaults(func=run)


def default_model() -> Path:
    """The checkpoint ``eval`` uses without ``--model`` (``eval/parity.py`` shares it)."""
    return resolve_model(None)


def evaluated_model(model: str | None, model_args: dict) -> Path:
    """The one checkpoint this run evaluates: ``--model`` or ``pretrained=`` (not two different ones).

    ``--model oled_llada2`` is lm-eval's spelling (there --model names the model type) and stands
    for no folder; ``pretrained=`` then names it, as in lm-eval.
    """
    if model == LM_EVAL_MODEL and not Path(model).exists():
        model = None
    pretrained = model_args.get("pretrained")
    if pretrained is None:
        return resolve_model(model)
    path = resolve_model(str(pretrained), flag="--model-args pretrained")
    if model is not None and resolve_model(model).resolve() != path.resolve():
        raise ValueError(f"--model {model} and --model-args pretrained={pretrained} name different checkpoints; "
                         "give the checkpoint once")
    return path


def run(args: argparse.Namespace) -> int:
    from ..evaluation.runner import go_offline

    go_offline()  # before lm-eval / datasets are imported
    try:
        from lm_eval.utils import make_table
    except ImportError as err:
        raise ValueError(f"oled-moe eval needs lm-eval ({err}); install it with: pip install 'oled-hf[eval]'") from err

    from ..evaluation.runner import evaluate, format_offload, make_lm, parse_model_args
    from ..evaluation.tasks import default_tasks_dir

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise ValueError("--tasks is empty")
    model_args = parse_model_args(args.model_args)
    flags = flag_budget(args, model_args)
    model_args.update(flags)
    shown = ",".join([*filter(None, [args.model_args]), *(f"{k}={v}" for k, v in flags.items())])
    model = evaluated_model(args.model, model_args)
    if args.output_path:  # refused now, not after the evaluation
        check_output_path(Path(args.output_path), args.overwrite)
    model_args["pretrained"] = str(model)
    if "device" in model_args:
        model_args["device"] = resolve_device(model_args["device"], f"--model-args device={model_args['device']}")
    else:
        model_args["device"] = resolve_device(args.device)
    include = [default_tasks_dir()] + [Path(p) for p in args.include_path]
    limit = int(args.limit) if args.limit is not None and args.limit >= 1 else args.limit
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    batch_size = model_args.setdefault("batch_size", args.batch_size)  # pretrained=...,batch_size=N wins, as in lm-eval
    lm = make_lm(str(model), model_args)
    results = evaluate(lm, tasks, include_paths=include, limit=limit, num_fewshot=args.num_fewshot,
                       gen_kwargs=args.gen_kwargs, apply_chat_template=args.apply_chat_template,
                       log_samples=args.log_samples, seed=args.seed, quiet=args.quiet)
    elapsed = time.perf_counter() - start
    results["config"]["model_args"] = shown
    print(f"oled_llada2 ({model}), model_args: {shown or '-'}, device: {model_args['device']}, "
          f"limit: {limit}, batch size: {batch_size}, {elapsed:.1f} s")
    print(make_table(results))
    if results.get("groups"):
        print(make_table(results, "groups"))
    stats = results["config"].get("offload")
    if stats is not None:
        print(format_offload(stats))
    if args.output_path:
        path = _write(results, Path(args.output_path), model)
        print(f"results written to {path}")
    return 0


def flag_budget(args: argparse.Namespace, model_args: dict) -> dict:
    """The budget flags as model_args fields (checked by ``budget_choices``; {} when none is given).

    Given both as a flag and in --model-args, the budget is refused rather than one silently
    winning. ``auto_batch_size`` / ``auto_context_length`` pass only when given, so the adapter's
    defaults (``batch_size``, ``max_length``) hold as they do for --model-args cache_ratio=auto.
    """
    budgets = budget_choices(args)
    if not budgets:
        return {}
    fields = {k: v for k, v in budgets[0].items() if not k.startswith("auto_") or getattr(args, k) is not None}
    typed = next((k for k in BUDGET_KEYS if k in model_args and (k in fields or not k.startswith("auto_"))), None)
    if typed is not None:
        flag = next(f"--{k.replace('_', '-')}" for k in BUDGET_KEYS if getattr(args, k, None) is not None)
        raise ValueError(f"the budget is given twice, as {flag} and as --model-args {typed}={model_args[typed]}: "
                         "give it once")
    return fields


def check_output_path(out: Path, overwrite: bool) -> None:
    """Refuse an --output-path the results could not be written to as asked, before any work.

    A ``.json`` path is a file (:func:`check_new_file`: its folder exists, it is new unless
    --overwrite); anything else is a folder, made if missing when its parent exists, where each run
    adds a new timestamped file (:func:`check_new_files`).
    """
    if out.suffix == ".json":
        check_new_file(out, overwrite=overwrite, field="--output-path", flag="--overwrite")
    else:
        check_new_files(out, [], overwrite=overwrite, field="--output-path", flag="--overwrite", create=True)


def _write(results: dict, out: Path, model: Path) -> Path:
    """The results as JSON at ``out`` (checked before the run), written whole or not at all."""
    if out.suffix != ".json":
        out.mkdir(exist_ok=True)
        out = new_name(out, f"results_{model.name}_{time.strftime('%Y%m%dT%H%M%S')}")
    write_text_atomically(json.dumps(results, indent=2, default=str), out)
    return out


def new_name(folder: Path, stem: str) -> Path:
    """``folder/stem.json``, or ``stem-2.json``, ... : a run that ends in the same second as another keeps both."""
    path, n = folder / f"{stem}.json", 1
    while path.exists() or path.is_symlink():
        n += 1
        path = folder / f"{stem}-{n}.json"
    return path
