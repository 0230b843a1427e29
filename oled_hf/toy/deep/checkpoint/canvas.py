"""Lay a left-padded batch on one block grid so every row decodes its blocks in lockstep.

Blocks sit at absolute multiples of ``block_length`` *per sequence*. Row ``i`` (prompt length
``P_i``) is shifted right by a whole number of blocks, ``s_i``, so that every row's first
decoding block lands on the same canvas block; columns before ``s_i`` are padding, invisible to
attention, and canvas column ``c`` is position ``c - s_i``. Each row then sees exactly what it
sees when generated alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Canvas:
    tokens: torch.Tensor  # [rows, W] prompt, masks to decode, pad elsewhere
    valid: torch.Tensor  # [rows, W] long, 1 where a column belongs to the row (prompt or generation)
    position_ids: torch.Tensor  # [rows, W]
    shift: list[int]  # s_i
    prompt_lengths: list[int]  # P_i
    gen_start: list[int]  # canvas column of each row's first generated token
    first_block: int  # canvas block where decoding starts
    num_blocks: int
    block_length: int

    def block_slice(self, block: int) -> slice:
        return slice(block * self.block_length, (block + 1) * self.block_length)


def prompt_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[torch.Tensor]:
    """Each row's real tokens; padding must be on the left (as pipelines and lm-eval send it)."""
    if attention_mask is None:
        return list(input_ids)
    rows = []
    for i, (ids, mask) in enumerate(zip(input_ids, attention_mask)):
        n = int(mask.sum())
        if n == 0:
            raise ValueError(f"row {i} of input_ids is all padding: every prompt needs at least one token")
        if not bool(mask[-n:].all()):
            raise ValueError(
                f"row {i} of attention_mask is not left-padded; pad prompts on the left "
                "(tokenizer.padding_side = 'left')"
            )
        rows.append(ids[-n:])
    return rows


def build_canvas(
    prompts: list[torch.Tensor], max_new_tokens: int, block_length: int, mask_token_id: int, pad_token_id: int
) -> Canvas:
    b = block_length
    lengths = [int(p.shape[0]) for p in prompts]
    first = max(n // b for n in lengths)
    shifts = [(first - n // b) * b for n in lengths]
    ends = [s + -(-(n + max_new_tokens) // b) * b for s, n in zip(shifts, lengths)]
    width = max(ends)
    device = prompts[0].device
    tokens = torch.full((len(prompts), width), pad_token_id, dtype=torch.long, device=device)
    valid = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
    cols = torch.arange(width, device=device)
    position_ids = torch.stack([torch.clamp(cols - s, min=0) for s in shifts])
    for i, (p, s, n, e) in enumerate(zip(prompts, shifts, lengths, ends)):
        tokens[i, s : s + n] = p
        tokens[i, s + n : e] = mask_token_id
        valid[i, s:e] = 1
    return Canvas(tokens, valid, position_ids, shifts, lengths, [s + n for s, n in zip(shifts, lengths)],
                  first, width // b, b)
