"""Token choice and commit rules for one denoising iteration (pure tensor functions).

``official`` is the LLaDA2 HF ``generate`` rule: every masked position whose confidence is
strictly above the threshold, or else the ``n_s`` most confident ones that the per-block step
schedule asks for. The schedule spreads ``block_length`` tokens over ``steps`` (as the official
``get_num_transfer_tokens(block_length, steps)`` does), whatever the block's masked count.
``dinfer`` is dInfer's threshold decoder: ``p >= min(threshold, max_p - 1e-5)``, no schedule.
Both add guards the references lack: the mask token is never chosen, an iteration with masks
left always commits at least one token (dInfer can otherwise loop forever), and the top-``n_s``
fallback never picks an unmasked position (the official ``topk`` over ``-inf`` confidences
would, when fewer masks are left than the schedule asks for, and overwrite that token).
"""

from __future__ import annotations

import torch

COMMIT_RULES = ("official", "dinfer")


def transfer_schedule(num_masked: torch.Tensor, steps: int) -> torch.Tensor:
    """Spread each row's count evenly over ``steps``, remainder to the first steps: [rows, steps].

    The decoder passes ``block_length`` for every row (the official sizing), not the masked count.
    """
    base = num_masked // steps
    remainder = num_masked % steps
    schedule = base[:, None].expand(-1, steps).clone()
    schedule += (torch.arange(steps, device=num_masked.device)[None, :] < remainder[:, None]).long()
    return schedule


def _filter_logits(logits: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative - sorted_logits.softmax(dim=-1) > top_p  # keep the token that crosses top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits


def choose_tokens(
    logits: torch.Tensor,
    mask_token_id: int,
    *,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidate token and its probability per position: (ids [.., B] long, p [.., B] fp32).

    Greedy: the argmax of the fp32 *logits* with the mask token's excluded, as dInfer's threshold
    decoder takes it (exact ties: the lowest id). A decoder taking ``argmax(softmax(logits))`` can
    differ where two logits round to one fp32 probability (it takes the lower id): a deliberate
    difference, since the logits order the candidates exactly (docs/model.md). p is that token's
    probability under the full softmax (mask token included, as the official decoders compute it).
    Sampling: temperature, top-k, top-p, multinomial; p the sampled token's filtered probability.
    """
    logits = logits.float()
    if not do_sample or temperature == 0:
        ranked = logits.clone()
        ranked[..., mask_token_id] = float("-inf")
        ids = ranked.argmax(dim=-1)
        return ids, logits.softmax(dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    logits = logits / temperature
    logits[..., mask_token_id] = float("-inf")
    probs = _filter_logits(logits, top_k, top_p).softmax(dim=-1)
    flat = probs.reshape(-1, probs.shape[-1])
    ids = torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])
    return ids, probs.gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def commit_official(confidence: torch.Tensor, scheduled: torch.Tensor, threshold: float) -> torch.Tensor:
    """Rows of ``confidence`` are -inf where not masked. Returns bool [rows, B] of positions to commit."""
    masked = confidence > float("-inf")
    above = (confidence > threshold) & masked
    n_masked = masked.sum(-1)
    want = torch.minimum(torch.clamp(scheduled, min=1), n_masked)
    use_above = above.sum(-1) >= want
    ranks = confidence.argsort(dim=-1, descending=True).argsort(dim=-1)
    top = (ranks < want[:, None]) & masked
    return torch.where(use_above[:, None], above, top)


def commit_dinfer(confidence: torch.Tensor, threshold: float) -> torch.Tensor:
    """Commit ``p >= min(threshold, max_p - 1e-5)``: the threshold set plus always the best (ties too)."""
    masked = confidence > float("-inf")
    best = confidence.max(dim=-1, keepdim=True).values
    cut = torch.clamp(best - 1e-5, max=threshold)
    return (confidence >= cut) & masked


def edit_positions(ids: torch.Tensor, prob: torch.Tensor, tokens: torch.Tensor, editable: torch.Tensor,
                   editing_threshold: float) -> torch.Tensor:
    """LLaDA2.1 token editing: bool [rows, B] of decoded tokens to replace by this iteration's candidate.

    ``editable`` marks tokens decoded before this iteration that are not prompt (and belong to a row
    still decoding the block). A token is replaced when the candidate differs from it and the
    candidate's probability is strictly above ``editing_threshold``: the rule of the diffusers
    ``BlockRefinementScheduler`` / dllm LLaDA2.1 sampler reimplementations (shared/docs/llada2.md
    §5.5). Candidates never are the mask token (``choose_tokens``), so an edit never re-masks.
    """
    return editable & (ids != tokens) & (prob > editing_threshold)
