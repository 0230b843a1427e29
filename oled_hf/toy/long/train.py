"""Train the long-answer toy (LLaDA2.0-mini's routing shape) with block diffusion on CPU.

``python -m oled_hf.toy.long.train OUT [--preset long|deep] [--task NAME[:WEIGHT[:LO-HI]] ...] [--steps N]
[--seed S] [--init PREVIOUS_CHECKPOINT] [--overwrite]``

The network is ``OledLLaDA2ForDiffusionLM`` with ``LONG_MODEL`` (256 experts of width 16, top-8,
``n_group=8``, ``topk_group=4``, one shared expert, layer 0 dense, QK-norm, partial RoPE), trained
by the 3-digit toy's recipe (``oled_hf/toy/train.py``: each layer's experts trained as one stacked
bank through the grouped executor, AdamW, cosine LR, LLaDA2's aux-loss-free expert-bias balancing,
one thread for bitwise determinism) on the task mix given by ``--task`` (default: ``DEFAULT_TASKS``
of ``tasks.py`` at equal weight: two labelled one-answer tasks and three with many right answers).
``--preset deep`` is the same routing shape with 8 MoE layers (``DEEP_MODEL``). Training runs in
resumable stages: ``--init`` continues a checkpoint (periodic ones too: every ``--eval-every`` steps
the folder holds a loadable checkpoint), and the report's ``stages`` lists every stage's command.
Noising is block diffusion with a clean prefix (``data.py``); each batch's block-causal mask uses a
block length drawn from ``BLOCK_LENGTHS``.
``OUT/long_report.json`` records the command, the mix, the curve and the held-out figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import GenerationConfig

from ...fileio import write_text_atomically
from ...modeling import OledLLaDA2ForDiffusionLM
from ...progress import add_quiet_argument, progress
from ..output import add_overwrite_argument, built_tokenizer, check_output, save_checkpoint
from ..train import (
    end_training,
    lr_at,
    optimizer_step,
    set_executor,
    toy_config,
    trainable_parameters,
    training_executor,
)
from . import REPORT_NAME
from .data import LongEncoding, NoisedBatch, noise_batch, required_canvas, sample_batch
from .evaluate import evaluate  # imported up front: a run never picks up an evaluate.py edited while it trains
from .tasks import DEFAULT_TASKS, TaskSpec, parse_mix
from .tokenizer import build_long_tokenizer

LONG_MODEL = dict(
    hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    partial_rotary_factor=0.5, rotary_dim=16, rope_theta=10000.0, intermediate_size=256, first_k_dense_replace=1,
    num_experts=256, num_experts_per_tok=8, num_shared_experts=1, moe_intermediate_size=16, n_group=8,
    topk_group=4, routed_scaling_factor=2.5, max_position_embeddings=256,
)
# The deep preset: LLaDA2.0-mini's routing shape at depth, 8 MoE layers after the dense layer 0 (mini
# has 19), so layer-adaptive allocation has layers to tell apart. Width as the shipped toy's (hidden
# 128, experts of 16), the shape known to train on 2 CPU cores; 13.5M parameters, 54 MB in fp32.
DEEP_CHANGES = dict(num_hidden_layers=9)
DEEP_MODEL = {**LONG_MODEL, **DEEP_CHANGES}
PRESETS = ("long", "deep")
# The name `oled-moe serve` serves each preset's checkpoint under (config.json's oled_model_name); the
# 3-digit toy's TOY_IDENTITY name stays with that toy. With --init the checkpoint keeps its own name.
MODEL_NAMES = {"long": "oled-toy-long", "deep": "oled-toy-deep"}
BLOCK_LENGTHS = (16, 32)
GENERATION = dict(block_length=16, threshold=0.95, steps=16, max_new_tokens=96, do_sample=False, eos_early_stop=True)
SHARD_SIZE = "8MB"


def block_diffusion_loss(logits: torch.Tensor, batch: NoisedBatch, start: int) -> torch.Tensor:
    """Sum over masked positions of CE / t, over the number of answer positions (logits cover ``start:``)."""
    targets = batch.clean[:, start:]
    masked = batch.masked[:, start:]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none").view_as(masked)
    return (ce * masked / batch.t[:, None]).sum() / batch.answer.sum().clamp(min=1)


def _quick_eval(model, tokenizer, mix, n: int) -> dict:
    model.eval()
    r = evaluate(model, tokenizer, mix, n=n, block_length=GENERATION["block_length"],
                 threshold=GENERATION["threshold"], examples=0)
    model.train()
    out = {t["task"]: round(t["accuracy"], 3) for t in r["tasks"]} | {
        "iterations_per_block": round(r["overall"]["iterations_per_block"], 2)}
    if "open" in r:
        out["open_iterations_per_block"] = round(r["open"]["iterations_per_block"], 2)
    return out


def stage_commands(previous: dict | None, command: list[str]) -> list[list[str]]:
    """Every stage's command, oldest first: the ``--init`` checkpoint's stages, then this one."""
    if previous is None:
        return [command]
    earlier = previous.get("stages") or ([previous["command"]] if previous.get("command") else [])
    return [*earlier, command]


def scheduled_lr(step: int, steps: int, lr: float, warmup: int, elapsed: float, minutes: float | None) -> float:
    """The 3-digit toy's warmup + cosine, over steps or (``minutes``) over whichever budget runs out first.

    On a shared machine the step rate is unknown in advance; a time budget with the cosine still
    reaching its floor at the stop gives a finished schedule, at the cost of bitwise determinism
    (the step count then depends on the machine, and the report says so).
    """
    if minutes is None:
        return lr_at(step, steps, lr, warmup)
    progress = max(step / steps, elapsed / (minutes * 60))
    return lr_at(int(progress * steps), steps, lr, warmup)


def _save(model, out: Path, config, report: dict, tokenizer_files: dict[str, bytes]) -> None:
    """The checkpoint (weights, tokenizer, report) moved into ``out`` whole (:func:`save_checkpoint`)."""
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, bos_token_id=config.bos_token_id,
        mask_token_id=config.mask_token_id, **GENERATION,
    )
    save_checkpoint(model, out, {**tokenizer_files, REPORT_NAME: json.dumps(report, indent=2) + "\n"},
                    shard_size=SHARD_SIZE)


def train_long(
    out_dir: str | os.PathLike,
    mix: tuple[TaskSpec, ...],
    seed: int = 0,
    *,
    steps: int = 2000,
    minutes: float | None = None,
    time_schedule: bool = False,
    batch_size: int = 32,
    lr: float = 2e-3,
    warmup: int = 100,
    block_lengths: tuple[int, ...] = BLOCK_LENGTHS,
    canvas_length: int | None = None,
    bias_rate: float = 1e-3,
    threads: int | None = 1,
    eval_n: int = 200,
    quick_eval_n: int = 20,
    log_every: int = 100,
    eval_every: int = 500,
    save: bool = True,
    model_overrides: dict | None = None,
    preset: str = "long",
    init: str | os.PathLike | None = None,
    command: list[str] | None = None,
    log=print,
    quiet: bool = False,
    overwrite: bool = False,
) -> dict:
    """Train on ``mix``, evaluate held-out (``eval_n`` per task) and (``save``) write the checkpoint.

    ``preset`` names the shape (``PRESETS``: ``long``, the shipped toy's; ``deep``, 8 MoE layers),
    ``model_overrides`` changes fields of it; with ``init`` the shape is the checkpoint's and
    training continues from its weights (a new stage: fresh warmup and cosine over ``steps``).
    Progress on stderr (``oled_hf.progress``): a bar on a terminal, a line every 10 s and the
    duration in a log, nothing with ``quiet``. With ``save``, ``out_dir`` is checked before the first
    step (new or empty unless ``overwrite``) and every save moves a whole checkpoint in.
    """
    base = check_start(preset, init, model_overrides)  # refused before anything is written
    out = check_output(out_dir, overwrite) if save else Path(out_dir)
    if threads:
        torch.set_num_threads(threads)
    tokenizer, tokenizer_files = built_tokenizer(build_long_tokenizer)
    enc = LongEncoding.from_tokenizer(tokenizer)
    canvas_length = canvas_length or required_canvas(enc, mix, max(block_lengths))
    config = toy_config(tokenizer, **{**base, **(model_overrides or {})}, oled_model_name=MODEL_NAMES[preset])
    torch.manual_seed(seed)
    previous = None
    if init is not None:  # continue training a saved long-answer toy (a fresh warmup + cosine over ``steps``)
        model = OledLLaDA2ForDiffusionLM.from_pretrained(init, dtype=torch.float32)
        config = model.config
        report_path = Path(init) / REPORT_NAME
        if report_path.is_file():
            previous = {k: v for k, v in json.loads(report_path.read_text()).items() if k not in ("curve", "heldout")}
    else:
        model = OledLLaDA2ForDiffusionLM(config)
    model.train()
    executor = training_executor()
    set_executor(model, executor)
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(trainable_parameters(model, executor), lr=lr, betas=(0.9, 0.98), weight_decay=0.0,
                                  foreach=True)
    log(f"canvas {canvas_length}, {sum(p.numel() for p in model.parameters())} parameters, "
        f"mix {' '.join(map(str, mix))}")

    losses: list[float] = []
    curve: list[dict] = []
    start = time.perf_counter()
    stopped_early = False
    step = 0
    bar = progress(total=steps, desc="training", unit="step", quiet=quiet)
    for step in range(steps):
        elapsed = time.perf_counter() - start
        if minutes is not None and elapsed > minutes * 60:
            stopped_early = True
            break
        for group in optimizer.param_groups:
            group["lr"] = scheduled_lr(step, steps, lr, warmup, elapsed, minutes if time_schedule else None)
        block_length = block_lengths[int(torch.randint(len(block_lengths), (1,), generator=generator))]
        clean, lengths, _ = sample_batch(enc, mix, batch_size, canvas_length, rng)
        batch = noise_batch(clean, lengths, block_length, enc.mask, enc.eos, generator)
        keep_from = int(lengths.min())
        out_ = model(input_ids=batch.noised, block_length=block_length, output_router_logits=True,
                     logits_to_keep=canvas_length - keep_from)
        loss = block_diffusion_loss(out_.logits, batch, keep_from)
        optimizer_step(model, optimizer, loss, out_.router_logits, bias_rate)
        losses.append(loss.item())
        bar.update()
        if log_every and (step + 1) % log_every == 0:
            elapsed = time.perf_counter() - start
            recent = sum(losses[-log_every:]) / len(losses[-log_every:])
            log(f"step {step + 1}/{steps}  loss {recent:.4f}  {elapsed:.0f}s  {(step + 1) / elapsed:.2f} steps/s")
        if eval_every and (step + 1) % eval_every == 0 and step + 1 < steps:
            curve.append({"step": step + 1, "seconds": round(time.perf_counter() - start),
                          **_quick_eval(model, tokenizer, mix, quick_eval_n)})
            log(f"quick held-out ({quick_eval_n}/task): {curve[-1]}")
            if save:  # an intermediate checkpoint to look at while training goes on (overwritten at the end)
                _save(model, out, config, {"partial": True, "command": command or [],
                                           "stages": stage_commands(previous, command or []),
                                           "tasks": [str(t) for t in mix], "step": step + 1,
                                           "init": None if init is None else str(init), "previous": previous,
                                           "curve": curve}, tokenizer_files)
    else:
        step = steps
    bar.close()
    train_seconds = time.perf_counter() - start

    end_training(model)
    report: dict = {
        "command": command or [],
        "stages": stage_commands(previous, command or []),
        "preset": None if init is not None else preset,
        "tasks": [str(t) for t in mix],
        "seed": seed, "steps": step, "steps_requested": steps, "stopped_early_by_time_limit": stopped_early,
        "lr_schedule_over": f"{minutes} minutes" if time_schedule else f"{steps} steps",
        "train_seconds": round(train_seconds, 1), "threads": torch.get_num_threads(), "batch_size": batch_size,
        "lr": lr, "warmup": warmup, "block_lengths": list(block_lengths), "canvas_length": canvas_length,
        "bias_rate": bias_rate,
        "model": {k: getattr(config, k) for k in LONG_MODEL},
        "init": None if init is None else str(init), "previous": previous,
        "parameters": sum(p.numel() for p in model.parameters()),
        "loss_first_10": sum(losses[:10]) / max(1, len(losses[:10])),
        "loss_last_100": sum(losses[-100:]) / max(1, len(losses[-100:])),
        "curve": curve,
    }
    if save:
        _save(model, out, config, report, tokenizer_files)
    if eval_n:
        eval_start = time.perf_counter()
        settings = progress(((16, 0.95), (32, 0.9)), desc=f"held-out evaluation ({eval_n} per task)",
                            unit="setting", quiet=quiet)  # minutes: a log gets the duration
        report["heldout"] = [evaluate(model, tokenizer, mix, n=eval_n, block_length=b, threshold=thr)
                             for b, thr in settings]
        report["eval_seconds"] = round(time.perf_counter() - eval_start, 1)
        if save:
            write_text_atomically(json.dumps(report, indent=2) + "\n", out / REPORT_NAME)
    report["trained_model"] = model
    return report


def check_start(preset: str, init, model_overrides: dict | None) -> dict:
    """The preset's fields, after refusing a combination that cannot start (named as on the command line)."""
    base = preset_model(preset)
    if init is not None and model_overrides:
        raise ValueError("--model overrides cannot be combined with --init (the shapes come from the checkpoint)")
    if init is not None and not (Path(init) / "config.json").is_file():
        raise ValueError(f"--init {init}: no config.json there (expected a long-answer checkpoint folder)")
    return base


def preset_model(name: str) -> dict:
    """The config fields of preset ``name`` (looked up at call time: tests patch ``LONG_MODEL``)."""
    if name not in PRESETS:
        raise ValueError(f"--preset {name!r}: expected one of {', '.join(PRESETS)}")
    return {**LONG_MODEL, **DEEP_CHANGES} if name == "deep" else LONG_MODEL


def parse_overrides(items: list[str]) -> dict:
    """``FIELD=VALUE`` pairs for ``LONG_MODEL`` fields, each value parsed as the field's type."""
    out: dict = {}
    for item in items:
        field, sep, value = item.partition("=")
        if not sep or field not in LONG_MODEL:
            raise ValueError(f"--model {item!r}: expected FIELD=VALUE with FIELD one of {', '.join(LONG_MODEL)}")
        kind = type(LONG_MODEL[field])
        try:
            out[field] = kind(float(value)) if kind is int and float(value).is_integer() else kind(value)
        except ValueError:
            raise ValueError(f"--model {item!r}: {field} must be of type {kind.__name__}") from None
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="checkpoint folder to write")
    parser.add_argument("--task", action="append", default=None, metavar="NAME[:WEIGHT[:LO-HI]]",
                        help=f"a task of the mix (repeatable); default: {', '.join(DEFAULT_TASKS)} at weight 1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--minutes", type=float, default=None, help="safety stop (breaks bitwise determinism)")
    parser.add_argument("--time-schedule", action="store_true",
                        help="run the cosine over --minutes (or --steps, whichever ends first): for shared machines")
    parser.add_argument("--eval-n", type=int, default=200, help="held-out problems per task for the report")
    parser.add_argument("--eval-every", type=int, default=500, help="quick held-out check and checkpoint save")
    parser.add_argument("--threads", type=int, default=1, help="torch threads; 1 is bitwise reproducible")
    parser.add_argument("--init", default=None,
                        help="continue from this checkpoint (its shapes and weights; a new schedule over --steps)")
    parser.add_argument("--preset", default="long", metavar="|".join(PRESETS),
                        help="model shape: long (the shipped toy, 3 MoE layers) or deep (8 MoE layers)")
    parser.add_argument("--model", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a LONG_MODEL config field (repeatable), e.g. --model hidden_size=192")
    add_overwrite_argument(parser)
    add_quiet_argument(parser)
    args = parser.parse_args(argv)
    try:
        overrides = parse_overrides(args.model)
        mix = parse_mix(args.task)
        check_start(args.preset, args.init, overrides)
        check_output(args.out, args.overwrite)  # before training, not after
    except ValueError as e:
        parser.error(str(e))
    report = train_long(args.out, mix, seed=args.seed, steps=args.steps, minutes=args.minutes,
                        time_schedule=args.time_schedule,
                        batch_size=args.batch_size, lr=args.lr, eval_n=args.eval_n, eval_every=args.eval_every,
                        warmup=args.warmup, model_overrides=overrides, init=args.init,
                        preset=args.preset,
                        threads=args.threads, command=["python", "-m", "oled_hf.toy.long.train", *sys.argv[1:]]
                        if argv is None else ["python", "-m", "oled_hf.toy.long.train", *argv],
                        log=lambda s: print(s, flush=True), quiet=args.quiet, overwrite=args.overwrite)
    report.pop("trained_model")
    print(json.dumps({k: v for k, v in report.items() if k != "curve"}, indent=2))


if __name__ == "__main__":
    main()
