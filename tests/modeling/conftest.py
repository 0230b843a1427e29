"""Fixture ``official_generate``: the official LLaDA2 decoders re-written from their rules
(shared/docs/llada2.md §5.1, §5.5).

A test fixture, not a copy of the official code: batch 1, no KV cache, the whole prefix
recomputed under the block-causal mask every iteration. It keeps our two documented guards (the
mask token is never chosen, the top-n fallback never picks an unmasked position) and otherwise
follows the rules literally, so ``generate`` can be compared with it token for token.

- 2.0 (§5.1): per-block schedule of ``block_length`` tokens spread over ``steps`` (remainder
  first); commit every masked position with p > threshold if there are at least ``n_s`` of them,
  else the ``n_s`` most confident; at most ``steps`` iterations per block.
- 2.1 (§5.5, the public 2.1 ``generate``: dllm ``pipelines/llada21``; SGLang ``JointThreshold``),
  with ``editing_threshold`` set: no schedule; each iteration commits every masked position with
  p > threshold if there are at least ``num_to_transfer`` of them, else the ``num_to_transfer``
  most confident; every position of the block that was decoded before this iteration and is not
  prompt is replaced where the argmax differs and p > editing_threshold; once nothing is masked
  at the start of an iteration it is a post step; the block ends after an iteration that started
  with nothing masked and edited nothing, or before a post step beyond ``max_post_steps``, and
  takes at most ``max(steps, block_length) + max_post_steps`` iterations.
"""

from __future__ import annotations

import pytest
import torch


def _schedule(block_length: int, steps: int) -> list[int]:
    base, rem = divmod(block_length, steps)
    return [base + (1 if s < rem else 0) for s in range(steps)]


def _greedy(logits: torch.Tensor, mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The official rule, ``argmax(logits)`` (mask excluded), and the token's softmax probability."""
    ranked = logits.float().clone()
    ranked[..., mask_id] = float("-inf")
    ids = ranked.argmax(-1)
    return ids, logits.float().softmax(-1).gather(-1, ids[..., None])[..., 0]


def reference_generate(model, prompt: torch.Tensor, *, gen_length: int, block_length: int, steps: int,
                       threshold: float, mask_id: int, eos_id: int, editing_threshold: float | None = None,
                       max_post_steps: int = 16, num_to_transfer: int = 1) -> tuple[list[int], int]:
    """New tokens (cut after the first EOS) and the number of denoising forwards."""
    p_len, b = int(prompt.shape[0]), block_length
    steps = min(steps, gen_length)
    num_blocks = -(-(p_len + gen_length) // b)
    x = torch.full((1, num_blocks * b), mask_id, dtype=torch.long)
    x[0, :p_len] = prompt
    schedule = _schedule(b, steps)
    forwards = 0
    for blk in range(p_len // b, num_blocks):
        end, start = (blk + 1) * b, blk * b
        prompt_cols = torch.arange(start, end) < p_len
        step, post = 0, 0
        while editing_threshold is None or step < max(steps, b) + max_post_steps:
            masked = x[0, start:end] == mask_id
            if not masked.any():
                if editing_threshold is None:
                    break
                post += 1
                if post > max_post_steps:
                    break
            elif editing_threshold is None and step >= steps:
                break
            with torch.no_grad():
                logits = model(x[:, :end], block_length=b).logits[0, -b:]
            forwards += 1
            ids, prob = _greedy(logits, mask_id)
            commit = torch.zeros(b, dtype=torch.bool)
            if masked.any():
                if editing_threshold is not None:
                    n = num_to_transfer  # 2.1: no schedule
                else:
                    n = schedule[step] if step < steps else 1
                conf = torch.where(masked, prob, torch.full_like(prob, float("-inf")))
                high = conf > threshold
                if int(high.sum()) >= n:
                    commit = high
                else:
                    commit[conf.topk(min(n, int(masked.sum()))).indices] = True
            edit = torch.zeros(b, dtype=torch.bool)
            if editing_threshold is not None:
                edit = ~masked & ~prompt_cols & (prob > editing_threshold) & (ids != x[0, start:end])
            x[0, start:end] = torch.where(commit | edit, ids, x[0, start:end])
            step += 1
            if not masked.any() and not edit.any():
                break
        if (x[0, p_len:end] == eos_id).any():
            break
    new = x[0, p_len : p_len + gen_length].tolist()
    if eos_id in new:
        new = new[: new.index(eos_id) + 1]
    return new, forwards


@pytest.fixture(scope="session")
def official_generate():
    return reference_generate
