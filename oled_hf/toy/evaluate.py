"""Greedy block-diffusion decoding and held-out exact match for the toy checkpoint.

The decoder follows ``shared/docs/llada2.md`` §5.2 (dInfer's threshold rule) without a KV cache:
each iteration runs the model over the canvas up to the end of the current block under the
block-causal mask, which is what the cached decoder computes. Per iteration and per row, every
masked position whose probability is at least ``min(threshold, max_p - 1e-5)`` is committed, so
at least the most confident token is always committed; the mask token is never predicted. A row
stops after the first block that contains an EOS. Rows are decoded together (all toy prompts have
the same length, so they share the block grid).

``python -m oled_hf.toy.evaluate [CHECKPOINT] [--n N] [--block-length B] [--threshold T]``
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field

import torch

from .data import ToyEncoding, answer_text, heldout_pairs


@dataclass
class DecodeResult:
    tokens: torch.Tensor  # [N, max_new_tokens] generated ids (mask id where never decoded)
    iterations: torch.Tensor  # [N] forwards that committed at least one token for the row
    committed: torch.Tensor  # [N] tokens committed for the row
    routing: dict = field(default_factory=dict)  # per-iteration expert statistics (when asked)

    @property
    def tokens_per_iteration(self) -> float:
        return float(self.committed.sum()) / max(1, int(self.iterations.sum()))


@torch.no_grad()
def block_diffusion_decode(
    model,
    prompt_ids: torch.Tensor,
    *,
    block_length: int,
    max_new_tokens: int,
    threshold: float = 0.9,
    mask_id: int,
    eos_id: int,
    routing_stats: bool = False,
) -> DecodeResult:
    """Greedy threshold decoding of equal-length prompts ``[N, P]`` (see the module docstring)."""
    n, p = prompt_ids.shape
    b = block_length
    total = math.ceil((p + max_new_tokens) / b) * b
    x = torch.full((n, total), mask_id, dtype=torch.long)
    x[:, :p] = prompt_ids
    done = torch.zeros(n, dtype=torch.bool)
    iterations = torch.zeros(n, dtype=torch.long)
    committed = torch.zeros(n, dtype=torch.long)
    distinct, overlap = [], []
    for block in range(p // b, total // b):
        start, end = block * b, (block + 1) * b
        previous = None
        while True:
            masked = (x[:, start:end] == mask_id) & ~done[:, None]
            rows = masked.any(dim=1).nonzero().squeeze(1)
            if rows.numel() == 0:
                break
            out = model(input_ids=x[rows, :end], block_length=b, output_router_logits=routing_stats)
            logits = out.logits[:, start:end].float()
            logits[..., mask_id] = float("-inf")
            probs, tokens = logits.softmax(dim=-1).max(dim=-1)
            row_masked = masked[rows]
            conf = torch.where(row_masked, probs, torch.full_like(probs, float("-inf")))
            best = conf.max(dim=1, keepdim=True).values
            commit = row_masked & (conf >= torch.clamp(best - 1e-5, max=threshold))
            block_view = x[rows, start:end]
            block_view[commit] = tokens[commit]
            x[rows, start:end] = block_view
            iterations[rows] += 1
            committed[rows] += commit.sum(dim=1)
            if routing_stats:
                used = _experts_used(out.router_logits, start, end, model.config.num_experts)
                distinct.append(used.sum(-1).float().mean().item())
                if previous is not None and previous.shape == used.shape:
                    inter = (used & previous).sum(-1).float()
                    overlap.append((inter / used.sum(-1).clamp(min=1)).mean().item())
                previous = used
        done |= (x[:, p:end] == eos_id).any(dim=1)
        if bool(done.all()):
            break
    routing = {}
    if routing_stats:
        routing = {
            "distinct_experts_per_layer_per_iteration": sum(distinct) / max(1, len(distinct)),
            "overlap_with_previous_iteration": sum(overlap) / max(1, len(overlap)) if overlap else None,
        }
    return DecodeResult(x[:, p : p + max_new_tokens], iterations, committed, routing)


def _experts_used(router_logits, start: int, end: int, num_experts: int) -> torch.Tensor:
    """[N, layers, E] bool: experts routed by the block's tokens, per row and MoE layer."""
    per_layer = []
    for _, ids in router_logits:
        ids = ids[:, start:end].reshape(ids.shape[0], -1)
        used = torch.zeros(ids.shape[0], num_experts, dtype=torch.bool)
        used.scatter_(1, ids, True)
        per_layer.append(used)
    return torch.stack(per_layer, dim=1)


def decode_text(tokenizer, ids: torch.Tensor, eos_id: int) -> str:
    ids = ids.tolist()
    if eos_id in ids:
        ids = ids[: ids.index(eos_id)]
    return tokenizer.decode(ids, skip_special_tokens=False)


@torch.no_grad()
def expert_load_stats(model, canvases: torch.Tensor, block_length: int) -> dict:
    """Per MoE layer: fraction of experts that receive tokens, and load spread, on clean canvases."""
    out = model(input_ids=canvases, block_length=block_length, output_router_logits=True)
    e = model.config.num_experts
    layers = []
    for _, ids in out.router_logits:
        load = torch.bincount(ids.reshape(-1), minlength=e).float()
        mean = load.mean()
        layers.append({
            "used_fraction": float((load > 0).float().mean()),
            "max_over_mean": float(load.max() / mean),
            "min_over_mean": float(load.min() / mean),
            "cv": float(load.std() / mean),
        })
    return {"layers": layers}


def evaluate_checkpoint(
    model,
    tokenizer,
    *,
    n: int = 1000,
    block_length: int = 8,
    threshold: float = 0.9,
    max_new_tokens: int = 8,
    batch_size: int = 500,
    routing_stats: bool = False,
) -> dict:
    """Held-out exact match and tokens committed per iteration with ``block_diffusion_decode``."""
    enc = ToyEncoding.from_tokenizer(tokenizer)
    pairs = heldout_pairs(n)
    correct, iters, committed, routing = 0, 0, 0, []
    examples = []
    for i in range(0, n, batch_size):
        chunk = pairs[i : i + batch_size]
        a = torch.tensor([x for x, _ in chunk])
        b = torch.tensor([y for _, y in chunk])
        res = block_diffusion_decode(
            model, enc.prompts(a, b), block_length=block_length, max_new_tokens=max_new_tokens,
            threshold=threshold, mask_id=enc.mask, eos_id=enc.eos, routing_stats=routing_stats,
        )
        for (x, y), ids in zip(chunk, res.tokens):
            got = decode_text(tokenizer, ids, enc.eos)
            correct += got == answer_text(x, y)
            if len(examples) < 5:
                examples.append({"question": f"{x}+{y}", "expected": answer_text(x, y), "got": got})
        iters += int(res.iterations.sum())
        committed += int(res.committed.sum())
        if routing_stats:
            routing.append(res.routing)
    report = {
        "n": n,
        "exact_match": correct / n,
        "tokens_per_iteration": committed / max(1, iters),
        "iterations_per_problem": iters / n,
        "block_length": block_length,
        "threshold": threshold,
        "max_new_tokens": max_new_tokens,
        "examples": examples,
    }
    if routing_stats:
        keys = [k for k in routing[0] if routing[0][k] is not None]
        report["routing"] = {k: sum(r[k] for r in routing) / len(routing) for k in keys}
    return report


def main(argv: list[str] | None = None) -> None:
    from transformers import AutoModelForCausalLM

    import oled_hf  # noqa: F401  (registers the model with the Auto classes)

    from ..checkpoints.tokenizer import load_tokenizer
    from . import TOY_CHECKPOINT

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", nargs="?", default=str(TOY_CHECKPOINT))
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--block-length", type=int, default=8)
    parser.add_argument("--threshold", type=float, default=0.9)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint).eval()
    tokenizer = load_tokenizer(args.checkpoint)
    report = evaluate_checkpoint(
        model, tokenizer, n=args.n, block_length=args.block_length, threshold=args.threshold,
        max_new_tokens=args.max_new_tokens, routing_stats=True,
    )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
