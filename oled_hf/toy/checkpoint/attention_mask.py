"""Attention masks of the LLaDA2 forward: the block-causal pattern, padding, and caller-built 4-D masks.

The model's own masks are bool, True = attend. A caller may also pass a 4-D mask it built itself,
in either of the two conventions LLaDA2's reference decoders use (shared/docs/llada2.md §4.2):

* bool, True = attend (dInfer's form);
* additive float, 0 = attend and ``-inf`` (or a large negative such as ``finfo.min``) = blocked:
  what the official HF ``generate`` and dllm's sampler build as ``tril(blocks).log()`` cast to the
  model dtype, and what the official forward adds to the attention scores as is.

A float mask is taken as additive and added to the scores, exactly as the official forward does.
A float mask with a value above 0 (a 0/1 keep-mask, say) is refused: read as additive it would
barely mask anything, read as 0/1 it is the opposite of an additive mask, and the two cannot be
told apart in general, so the caller is asked for a bool mask or the additive form.
"""

from __future__ import annotations

import torch


def block_causal_mask(
    query_start: int, query_len: int, key_len: int, block_length: int, device: torch.device
) -> torch.Tensor:
    """Bool [L, S], True = attend: key j is visible to query i iff block(j) <= block(i), blocks absolute."""
    q_block = torch.arange(query_start, query_start + query_len, device=device) // block_length
    k_block = torch.arange(key_len, device=device) // block_length
    return k_block[None, :] <= q_block[:, None]


def check_4d_mask(mask: torch.Tensor, batch: int, query_len: int, key_len: int, dtype: torch.dtype) -> torch.Tensor:
    """A caller's 4-D mask, checked: bool as is, float (additive) cast to ``dtype``; anything else refused.

    Shape ``[batch or 1, 1 or heads, queries, keys]``; the keys cover the cached prefix and the
    current tokens, as for a 2-D mask.
    """
    b, _, q, k = mask.shape
    if b not in (1, batch) or q != query_len or k != key_len:
        raise ValueError(
            f"attention_mask has shape {tuple(mask.shape)}; a 4-D mask must be (batch, 1 or heads, queries, keys) "
            f"= ({batch} or 1, 1, {query_len}, {key_len}), the keys covering the cached prefix and the current tokens"
        )
    if mask.dtype == torch.bool:
        return mask
    if not mask.is_floating_point():
        raise ValueError(
            f"attention_mask is a 4-D {mask.dtype} tensor; a 4-D mask must be bool (True = attend) or additive "
            "float (0 = attend, -inf = blocked, as the official LLaDA2 generate builds it)"
        )
    if bool(mask.isnan().any()) or bool((mask > 0).any()):
        top = float(mask.float().max())  # NaN where any value is NaN
        raise ValueError(
            f"attention_mask is a 4-D float mask with values above 0 or NaN (max {top}): a float 4-D mask is read "
            "as additive, as the official LLaDA2 forward reads it (0 = attend, -inf or a large negative = blocked); "
            "a 0/1 keep-mask is ambiguous. Pass a bool mask (True = attend) or the additive form "
            "(keep.log().to(model.dtype))"
        )
    return mask.to(dtype)


def build_attention_mask(
    attention_mask: torch.Tensor | None,
    block_length: int | None,
    batch: int,
    query_start: int,
    query_len: int,
    key_len: int,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor | None:
    """The 4-D mask the attention layers get (None = full attention).

    A 4-D ``attention_mask`` is the caller's (:func:`check_4d_mask`: bool, or additive float cast
    to ``dtype``) and cannot be combined with ``block_length``. Otherwise the block pattern and a
    2-D padding mask (1 = real token) are combined into a bool mask in which every query also sees
    itself, so padded rows never have an empty softmax (NaN would leak into the cache through
    ``0 * NaN`` in later layers). A padded 2-D mask leaves attention bidirectional (within the
    block pattern), where the official forward would build a causal mask from it.
    """
    if attention_mask is not None and attention_mask.dim() == 4:
        if block_length is not None:
            raise ValueError(
                f"block_length={block_length} cannot be combined with a 4-D attention_mask (the mask already "
                "says who attends to whom): pass one of them"
            )
        return check_4d_mask(attention_mask, batch, query_len, key_len, dtype).to(device)
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(
            f"attention_mask has {attention_mask.dim()} dimensions (shape {tuple(attention_mask.shape)}); allowed: "
            "2-D padding (batch, keys), 1 = real token, or a 4-D mask (batch, 1, queries, keys)"
        )
    if attention_mask is None and block_length is None:
        return None
    mask = torch.ones(query_len, key_len, dtype=torch.bool, device=device)
    if block_length is not None:
        mask = block_causal_mask(query_start, query_len, key_len, block_length, device)
    mask = mask[None, None].expand(batch, 1, query_len, key_len)
    if attention_mask is not None:
        if attention_mask.shape != (batch, key_len):
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)}; expected (batch, keys) = "
                f"({batch}, {key_len}) covering the cached prefix and the current tokens"
            )
        mask = mask & attention_mask.to(torch.bool)[:, None, None, :]
    diag = torch.zeros(query_len, key_len, dtype=torch.bool, device=device)
    diag[torch.arange(query_len), torch.arange(query_start, query_start + query_len)] = True
    return mask | diag


def apply_mask(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """fp32 attention scores under a bool (True = attend) or an additive float mask."""
    if mask is None:
        return scores
    if mask.dtype == torch.bool:
        return scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return scores + mask.to(scores.dtype)
