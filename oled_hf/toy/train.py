"""Train the toy LLaDA2 MoE on 3-digit addition with the masked-diffusion objective (CPU).

``python -m oled_hf.toy.train OUT [--seed S] [--steps N] [--minutes M] [--threads T] [--overwrite]``

The defaults (2,500 steps of 128 sequences) took 883 s on one core of a shared 2-core machine and
give 98.3% held-out exact match; ``OUT/toy_report.json`` records the run.

The network is ``OledLLaDA2ForDiffusionLM`` itself (dense layer 0, grouped sigmoid routing with an
expert bias, a shared expert, QK-norm, partial RoPE), so the saved folder is an official-layout
checkpoint that loads with our classes. Objective (LLaDA2 / masked diffusion): per sequence
``t ~ U(eps, 1]``; every answer position (digits, EOS and EOS padding) is replaced by the mask
token with probability ``t``; the prompt is never masked; the loss is the cross-entropy on masked
positions weighted by ``1/t``, normalised by the number of answer positions. Each batch uses the
block-causal attention mask of a block length drawn from ``block_lengths``, so decoding with any
of them sees what training saw (the canvas is a multiple of each).

Token-substitution noise (``--substitution-noise P``, off by default): LLaDA2.1 trains its
models to edit by corrupting tokens as well as masking them. Here each answer position left
unmasked is, with probability ``P``, replaced by a random answer token (a digit or EOS), and the
loss adds the cross-entropy at every unmasked answer position (substituted ones must be corrected,
kept ones kept), normalised like the masked term. Without it a model's predictions at decoded
positions are never trained, and editing on them is noise. ``--init CKPT`` starts from a saved
checkpoint instead of random weights (to add the noise to the shipped toy by fine-tuning).

Expert load balancing is LLaDA2's auxiliary-loss-free scheme: after each optimiser step, per MoE
layer, ``expert_bias += u * sign(mean_load - load)`` with the load counted over the batch's tokens.

Determinism: weights, data, masks and block lengths all come from ``seed``. With one torch thread
(the default) the same seed and step count give bit-identical weights (checked over 300 full-size
steps). With two threads they do not: some CPU kernel reduces in a thread-dependent order, so
two 2-thread runs already differ after 15 steps. One thread is also the faster choice on a
shared machine: with two threads, every one of the ~2,000 small GEMMs per step waits at an
OpenMP barrier for a thread the OS may have descheduled (measured 3-10x slower under load).
``--minutes`` is only a safety stop: when it fires, the step count and thus the weights depend on
the machine's speed, and the report says so (``stopped_early_by_time_limit``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import GenerationConfig

from ..modeling import OledLLaDA2Config, OledLLaDA2ForDiffusionLM
from ..modeling.experts import RESIDENT_EXECUTOR, expert_bank, group_tokens_by_expert, swiglu_expert
from ..progress import add_quiet_argument, progress
from .data import ToyEncoding, heldout_pairs, sample_train_pairs
from .output import add_overwrite_argument, built_tokenizer, check_output, save_checkpoint
from .tokenizer import build_toy_tokenizer

# toy-model.md's second run: 64 experts of width 32, top-4 over 8 groups keeping 4 (~2.8M parameters).
TOY_MODEL = dict(
    hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    partial_rotary_factor=0.5, rotary_dim=16, rope_theta=600000.0, intermediate_size=256, first_k_dense_replace=1,
    num_experts=64, num_experts_per_tok=4, num_shared_experts=1, moe_intermediate_size=32, n_group=8,
    topk_group=4, routed_scaling_factor=2.5, max_position_embeddings=256,
)
CANVAS_LENGTH = 32  # 25 prompt tokens + 7 answer slots (<= 4 digits, EOS, EOS padding)
BLOCK_LENGTHS = (8, 16, 32)  # every one divides the canvas; the answer slots share one block in each
GENERATION = dict(block_length=8, threshold=0.9, max_new_tokens=8, steps=8, do_sample=False, eos_early_stop=True)
DEFAULT_STEPS = 2500
SHARD_SIZE = "4MB"  # several shards plus an index, the official layout, even at this size


# What the checkpoint says about itself beyond its shape: the name `oled-moe serve` serves it under,
# and that it was trained on single-turn prompts only (`oled-moe chat` then keeps only the last turn).
TOY_IDENTITY = dict(oled_model_name="oled-toy-addition", oled_single_turn=True)


def toy_config(tokenizer, **overrides) -> OledLLaDA2Config:
    kwargs = {**TOY_IDENTITY, **TOY_MODEL, **overrides}
    return OledLLaDA2Config(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        mask_token_id=tokenizer.mask_token_id,
        **kwargs,
    )


class LoopTrainingExecutor:
    """Same math as the resident executor, shaped for autograd (fallback when grouped GEMM is missing).

    The resident executor writes each expert's rows into a preallocated tensor; the backward of
    those slice writes materialises a full-size gradient per expert. Concatenating the per-expert
    outputs and gathering them back is the same arithmetic with a cheap backward.
    """

    def __call__(self, moe_block, hidden_states, topk_ids, topk_weights):
        groups = group_tokens_by_expert(topk_ids)
        sorted_x = hidden_states[groups.token_index]
        outputs = []
        for i, expert_id in enumerate(groups.experts):
            expert = moe_block.experts[expert_id]
            outputs.append(swiglu_expert(
                sorted_x[groups.rows(i)], expert.gate_proj.weight, expert.up_proj.weight, expert.down_proj.weight
            ))
        return _combine(torch.cat(outputs), groups.order, topk_weights, hidden_states.dtype)


def _combine(sorted_outputs, order, topk_weights, dtype):
    """Back to (token, slot) order, weight in fp32, sum over the k slots, cast back (as ``moe_infer``)."""
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel())
    t, k = topk_weights.shape
    weighted = sorted_outputs[inverse].view(t, k, -1).to(topk_weights.dtype) * topk_weights.unsqueeze(-1)
    return weighted.sum(dim=1).to(dtype)


def training_executor():
    """The resident grouped executor where this torch has a CPU ``_grouped_mm`` with autograd, else the loop."""
    try:
        a = torch.randn(4, 4, requires_grad=True)
        b = torch.randn(2, 4, 4, requires_grad=True)
        y = torch._grouped_mm(a, b, offs=torch.tensor([2, 4], dtype=torch.int32))
        (y * y).sum().backward()
        return RESIDENT_EXECUTOR
    except (AttributeError, RuntimeError, NotImplementedError):
        return LoopTrainingExecutor()


def trainable_parameters(model: OledLLaDA2ForDiffusionLM, executor) -> list[torch.nn.Parameter]:
    """What the optimiser updates: with the grouped executor, each MoE layer's experts as its stacked bank.

    Why: the long toy has 256 experts x 3 matrices x 3 MoE layers = 2,304 expert tensors, and AdamW
    and gradient clipping cost a dozen small ops per tensor per step (~25% of a CPU step; 1.30x
    faster per step with two tensors per layer, measured interleaved). The bank
    (``modeling.experts.ExpertBank``: ``gate_up [E, 2I, H]``, ``down [E, H, I]``) is what the
    grouped executor reads and the per-expert parameters are views of it, so making its two
    tensors the leaves trains the same weights, and the views (what ``save_pretrained`` writes)
    see every update. The per-expert parameters stop requiring grad, which is what sends the
    resident executor to the bank under autograd; :func:`end_training` turns them back on.
    """
    if executor is not RESIDENT_EXECUTOR:
        return list(model.parameters())
    expert_params: set[int] = set()
    banks: list[torch.nn.Parameter] = []
    for block in model.moe_blocks():
        bank = expert_bank(block)
        bank.gate_up, bank.down = torch.nn.Parameter(bank.gate_up), torch.nn.Parameter(bank.down)
        banks += [bank.gate_up, bank.down]
        for p in block.experts.parameters():
            p.requires_grad_(False)
            expert_params.add(id(p))
    return [p for p in model.parameters() if id(p) not in expert_params] + banks


def end_training(model: OledLLaDA2ForDiffusionLM) -> None:
    """Undo :func:`trainable_parameters` (every parameter of a model being trained required grad)."""
    model.eval()
    set_executor(model, RESIDENT_EXECUTOR)
    for p in model.parameters():
        p.requires_grad_(True)


def set_executor(model: OledLLaDA2ForDiffusionLM, executor) -> None:
    for block in model.moe_blocks():
        block.experts_executor = executor


def diffusion_batch(enc: ToyEncoding, batch_size: int, canvas_length: int, generator: torch.Generator,
                    eps: float = 1e-3, substitution: float = 0.0):
    """Clean canvases, noised canvases, the mask of noised positions, t per row, and the prompt length.

    With ``substitution`` > 0, unmasked answer positions are replaced by a random answer token with
    that probability (no extra random numbers are drawn at 0, so existing seeds keep their weights).
    """
    a, b = sample_train_pairs(batch_size, generator)
    clean, p = enc.canvases(a, b, canvas_length)
    t = eps + (1 - eps) * torch.rand(batch_size, generator=generator)
    noised_answer = torch.rand(batch_size, canvas_length - p, generator=generator) < t[:, None]
    noised = clean.clone()
    noised[:, p:][noised_answer] = enc.mask
    if substitution > 0:
        vocab = torch.tensor(enc.digits + (enc.eos,))
        swap = (torch.rand(noised_answer.shape, generator=generator) < substitution) & ~noised_answer
        random = vocab[torch.randint(len(vocab), noised_answer.shape, generator=generator)]
        noised[:, p:] = torch.where(swap, random, noised[:, p:])
    return clean, noised, noised_answer, t, p


def diffusion_loss(answer_logits: torch.Tensor, clean: torch.Tensor, masked: torch.Tensor, t: torch.Tensor,
                   unmasked_too: bool = False):
    """Sum over masked answer positions of CE / t, divided by the number of answer positions.

    ``answer_logits`` covers the answer slots only (the last ``masked.shape[1]`` canvas positions).
    ``unmasked_too`` (substitution noise) adds the plain CE at every unmasked answer position.
    """
    targets = clean[:, -masked.shape[1]:]
    ce = F.cross_entropy(answer_logits.reshape(-1, answer_logits.shape[-1]), targets.reshape(-1),
                         reduction="none").view_as(masked)
    loss = (ce * masked / t[:, None]).sum() / masked.numel()
    if unmasked_too:
        loss = loss + (ce * ~masked).sum() / masked.numel()
    return loss


def optimizer_step(model, optimizer, loss: torch.Tensor, router_logits, bias_rate: float) -> None:
    """One AdamW step with gradient clipping, then the aux-loss-free expert-bias update (both toys)."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for group in optimizer.param_groups for p in group["params"]], 1.0)
    optimizer.step()
    update_expert_bias(model, router_logits, bias_rate)


@torch.no_grad()
def update_expert_bias(model: OledLLaDA2ForDiffusionLM, router_logits, rate: float) -> None:
    """LLaDA2's auxiliary-loss-free balancing: raise under-loaded experts' bias, lower over-loaded ones'."""
    for block, (_, ids) in zip(model.moe_blocks(), router_logits):
        load = torch.bincount(ids.reshape(-1), minlength=block.gate.expert_bias.numel()).float()
        block.gate.expert_bias += rate * torch.sign(load.mean() - load)


def lr_at(step: int, total: int, lr: float, warmup: int, final_fraction: float = 0.1) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return lr * (final_fraction + (1 - final_fraction) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def _quick_eval(model, tokenizer, step: int, canvas_length: int) -> dict:
    """A 200-problem held-out check during training (uses no training randomness)."""
    from .evaluate import evaluate_checkpoint

    model.eval()
    set_executor(model, RESIDENT_EXECUTOR)
    r = evaluate_checkpoint(model, tokenizer, n=200, block_length=GENERATION["block_length"],
                            threshold=GENERATION["threshold"], max_new_tokens=GENERATION["max_new_tokens"])
    enc = ToyEncoding.from_tokenizer(tokenizer)
    pairs = heldout_pairs(200)
    a, b = torch.tensor([x for x, _ in pairs]), torch.tensor([y for _, y in pairs])
    with torch.no_grad():
        out = model(input_ids=enc.canvases(a, b, canvas_length)[0], block_length=8, output_router_logits=True)
    e = model.config.num_experts
    used = [round(float((torch.bincount(ids.reshape(-1), minlength=e) > 0).float().mean()), 2)
            for _, ids in out.router_logits]
    model.train()
    set_executor(model, training_executor())
    return {"step": step, "exact_match": r["exact_match"], "tokens_per_iteration": round(r["tokens_per_iteration"], 3),
            "experts_used_fraction": used}


def train_toy(
    out_dir: str | os.PathLike,
    seed: int = 0,
    *,
    steps: int = DEFAULT_STEPS,
    minutes: float | None = 28.0,
    batch_size: int = 128,
    lr: float = 2e-3,
    warmup: int = 100,
    block_lengths: tuple[int, ...] = BLOCK_LENGTHS,
    canvas_length: int = CANVAS_LENGTH,
    bias_rate: float = 1e-3,
    threads: int | None = 1,
    eval_n: int = 1000,
    log_every: int = 100,
    eval_every: int = 500,
    save: bool = True,
    model_overrides: dict | None = None,
    substitution: float = 0.0,
    init: str | os.PathLike | None = None,
    log=print,
    quiet: bool = False,
    overwrite: bool = False,
) -> dict:
    """Train, evaluate on the held-out split and (``save``) write the checkpoint; returns the report.

    With ``save``, ``out_dir`` is checked before the first step (:func:`check_output`: new or empty
    unless ``overwrite``) and the checkpoint is written at the end in one move
    (:func:`save_checkpoint`): nothing is written there before, and a failed save leaves it as it was.
    """
    out = check_output(out_dir, overwrite) if save else Path(out_dir)
    if threads:
        torch.set_num_threads(threads)
    if any(canvas_length % b for b in block_lengths):
        raise ValueError(f"canvas_length={canvas_length} must be a multiple of every block length {block_lengths}")
    tokenizer, tokenizer_files = built_tokenizer(build_toy_tokenizer)
    enc = ToyEncoding.from_tokenizer(tokenizer)
    config = toy_config(tokenizer, **(model_overrides or {}))
    if not 0.0 <= substitution < 1.0:
        raise ValueError(f"substitution={substitution!r} is invalid: must be in [0, 1)")
    torch.manual_seed(seed)
    if init is not None:  # fine-tune a saved toy (same tokenizer, same shapes)
        model = OledLLaDA2ForDiffusionLM.from_pretrained(init, dtype=torch.float32)
        config = model.config
    else:
        model = OledLLaDA2ForDiffusionLM(config)
    model.train()
    executor = training_executor()
    set_executor(model, executor)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(trainable_parameters(model, executor), lr=lr, betas=(0.9, 0.98), weight_decay=0.0,
                                  foreach=True)

    losses: list[float] = []
    curve: list[dict] = []
    start = time.perf_counter()
    stopped_early = False
    step = 0
    bar = progress(total=steps, desc="training", unit="step", quiet=quiet)
    for step in range(steps):
        if minutes is not None and time.perf_counter() - start > minutes * 60:
            stopped_early = True
            break
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup)
        clean, noised, masked, t, p = diffusion_batch(enc, batch_size, canvas_length, generator,
                                                      substitution=substitution)
        block_length = block_lengths[int(torch.randint(len(block_lengths), (1,), generator=generator))]
        out_ = model(input_ids=noised, block_length=block_length, output_router_logits=True,
                     logits_to_keep=canvas_length - p)
        loss = diffusion_loss(out_.logits, clean, masked, t, unmasked_too=substitution > 0)
        optimizer_step(model, optimizer, loss, out_.router_logits, bias_rate)
        losses.append(loss.item())
        bar.update()
        if log_every and (step + 1) % log_every == 0:
            elapsed = time.perf_counter() - start
            recent = sum(losses[-log_every:]) / len(losses[-log_every:])
            log(f"step {step + 1}/{steps}  loss {recent:.4f}  {elapsed:.0f}s  {(step + 1) / elapsed:.2f} steps/s")
        if eval_every and (step + 1) % eval_every == 0 and step + 1 < steps:
            curve.append(_quick_eval(model, tokenizer, step + 1, canvas_length))
            log(f"step {step + 1}: quick held-out exact match {curve[-1]['exact_match']:.3f} (200 problems), "
                f"{curve[-1]['tokens_per_iteration']:.2f} tokens/iteration, experts used per layer "
                f"{curve[-1]['experts_used_fraction']}")
    else:
        step = steps
    bar.close()
    train_seconds = time.perf_counter() - start

    end_training(model)
    report: dict = {
        "seed": seed,
        "steps": step,
        "steps_requested": steps,
        "stopped_early_by_time_limit": stopped_early,
        "train_seconds": round(train_seconds, 1),
        "threads": torch.get_num_threads(),
        "batch_size": batch_size,
        "lr": lr,
        "block_lengths": list(block_lengths),
        "canvas_length": canvas_length,
        "bias_rate": bias_rate,
        "substitution_noise": substitution,
        "init": None if init is None else str(init),
        "parameters": sum(p.numel() for p in model.parameters()),
        "final_loss_mean_last_100": sum(losses[-100:]) / max(1, len(losses[-100:])),
        "loss_first_10": sum(losses[:10]) / max(1, len(losses[:10])),
        "loss_last_10": sum(losses[-10:]) / max(1, len(losses[-10:])),
        "curve": curve,
    }
    if eval_n:
        from .evaluate import evaluate_checkpoint, expert_load_stats

        eval_start = time.perf_counter()
        report["heldout"] = evaluate_checkpoint(
            model, tokenizer, n=eval_n, block_length=GENERATION["block_length"],
            threshold=GENERATION["threshold"], max_new_tokens=GENERATION["max_new_tokens"], routing_stats=True,
        )
        pairs = heldout_pairs(min(eval_n, 500))
        a = torch.tensor([x for x, _ in pairs])
        b = torch.tensor([y for _, y in pairs])
        canvases = enc.canvases(a, b, canvas_length)[0]
        report["expert_load"] = expert_load_stats(model, canvases, GENERATION["block_length"])
        report["eval_seconds"] = round(time.perf_counter() - eval_start, 1)
        log(f"held-out exact match {report['heldout']['exact_match']:.4f} on {eval_n}, "
            f"{report['heldout']['tokens_per_iteration']:.2f} tokens/iteration, {report['eval_seconds']} s")
    if save:
        model.generation_config = GenerationConfig(
            eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, bos_token_id=config.bos_token_id,
            mask_token_id=config.mask_token_id, **GENERATION,
        )
        save_checkpoint(model, out, {**tokenizer_files, "toy_report.json": json.dumps(report, indent=2) + "\n"},
                        shard_size=SHARD_SIZE)
    report["model"] = model
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="checkpoint folder to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--minutes", type=float, default=28.0, help="safety stop (breaks bitwise determinism)")
    parser.add_argument("--eval-n", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads; 1 is bitwise reproducible, 2 is not (see the module docstring)")
    parser.add_argument("--substitution-noise", type=float, default=0.0,
                        help="LLaDA2.1-style token-substitution noise on unmasked answer tokens (teaches editing)")
    parser.add_argument("--init", default=None, help="start from this checkpoint (fine-tune) instead of random")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=100)
    add_overwrite_argument(parser)
    add_quiet_argument(parser)
    args = parser.parse_args(argv)
    try:  # refused now, not after the training
        check_output(args.out, args.overwrite)
    except ValueError as err:
        parser.error(str(err))
    report = train_toy(args.out, seed=args.seed, steps=args.steps, minutes=args.minutes, eval_n=args.eval_n,
                       threads=args.threads, substitution=args.substitution_noise, init=args.init, lr=args.lr,
                       warmup=args.warmup, log=lambda s: print(s, flush=True), quiet=args.quiet,
                       overwrite=args.overwrite)
    report.pop("model")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
