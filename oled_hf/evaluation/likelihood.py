"""Monte-Carlo log-likelihood of a continuation under a masked-diffusion LM (pure torch, no lm-eval).

A masked diffusion LM has no left-to-right factorisation, so ``log p(continuation | context)`` is
estimated by its ELBO. For a continuation of ``n`` tokens the ELBO is

    E_t [ (1/t) * sum over positions masked at ratio t of log p_theta(x_i | context, x_t) ].

We sample it in the discrete form LLaDA's own evaluation uses: the number of masked tokens
``l ~ U{1..n}``, a uniformly random subset of that size, weight ``n / l`` (= ``1/t`` with
``t = l/n``). It is unbiased for the same ELBO as ``t ~ U(0,1]`` with independent masking, always
masks at least one token, and has lower variance. The estimate is the mean over ``mc_num`` samples.

Attention (``attention=``):

* ``"block"`` (default): the block-causal structure LLaDA2 is trained and decoded with, blocks at
  absolute multiples of ``block_length``. The continuation's blocks are scored as block diffusion
  scores them: each block is masked at its own ratio and sees the *clean* context and earlier
  blocks, exactly what ``generate`` sees when it decodes that block. One forward does this with
  two copies of the sequence (BD3-LM's vectorised form): the clean copy (block-causal among
  itself) and the noised copy of the blocks that hold the continuation; a noised token attends to
  the clean copy's earlier blocks and to its own noised block; both copies share position ids.
  The total is the sum of the per-block ELBOs.
* ``"full"``: one copy, fully bidirectional attention, one ratio for the whole continuation (the
  LLaDA 1 / MDLM estimator).

``is_greedy``: with every continuation token masked (per block, earlier blocks clean), the argmax
at each position (the mask token excluded, as in decoding) reproduces the continuation.

Randomness: each request draws its masks from a generator seeded by ``seed`` and the context
tokens only, so the estimate does not depend on request order or packing, and the choices of a
multiple-choice question with equal lengths share their masks (common random numbers: their
difference has less variance than either estimate).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

ATTENTION_MODES = ("block", "full")


@dataclass(frozen=True)
class MCSettings:
    mask_token_id: int
    mc_num: int = 32
    seed: int = 1234
    attention: str = "block"
    block_length: int | None = 32
    max_rows: int = 33  # rows (samples + greedy rows) per forward

    def __post_init__(self) -> None:
        if not isinstance(self.mc_num, int) or self.mc_num < 1:
            raise ValueError(f"mc_num={self.mc_num!r} is invalid: must be an integer >= 1")
        if self.attention not in ATTENTION_MODES:
            raise ValueError(f"mc_attention={self.attention!r} is unknown; allowed: {', '.join(ATTENTION_MODES)}")
        if self.attention == "block" and (not isinstance(self.block_length, int) or self.block_length < 1):
            raise ValueError(f"block_length={self.block_length!r} is invalid for mc_attention=block: integer >= 1")
        if not isinstance(self.max_rows, int) or self.max_rows < 1:
            raise ValueError(f"mc_batch_size={self.max_rows!r} is invalid: must be an integer >= 1")


def request_seed(seed: int, context: Sequence[int]) -> int:
    data = torch.tensor(list(context), dtype=torch.int64).numpy().tobytes()
    return (zlib.crc32(data) ^ (int(seed) * 0x9E3779B1)) & 0x7FFFFFFFFFFFFFFF


def continuation_blocks(context_len: int, n: int, block_length: int | None) -> list[tuple[int, int]]:
    """[start, end) ranges of continuation indices (0-based within the continuation) per block."""
    if block_length is None:
        return [(0, n)] if n else []
    out, i = [], 0
    while i < n:
        block = (context_len + i) // block_length
        end = min(n, (block + 1) * block_length - context_len)
        out.append((i, end))
        i = end
    return out


def draw_masks(n: int, blocks: list[tuple[int, int]], mc_num: int, generator: torch.Generator):
    """``masked`` bool [mc_num, n] and ``weight`` float [mc_num, n] (``n_b / l_b`` where masked, else 0)."""
    masked = torch.zeros(mc_num, n, dtype=torch.bool)
    weight = torch.zeros(mc_num, n, dtype=torch.float64)
    for s in range(mc_num):
        for start, end in blocks:
            size = end - start
            count = int(torch.randint(1, size + 1, (1,), generator=generator))
            picked = torch.randperm(size, generator=generator)[:count] + start
            masked[s, picked] = True
            weight[s, picked] = size / count
    return masked, weight


@dataclass
class _Layout:
    """Input layout shared by every request with the same (context length, continuation length)."""

    length: int  # tokens per row (both copies in block mode)
    noised_start: int  # first clean-sequence position that the noised copy repeats
    position_ids: torch.Tensor  # [length]
    mask: torch.Tensor | None  # [length, length] bool (True = attend) or None for full attention
    blocks: list[tuple[int, int]]
    block_length: int | None = None

    @property
    def prefix_len(self) -> int:
        """Leading clean tokens (whole blocks before the continuation) that nothing later changes."""
        return self.noised_start if self.mask is not None else 0


def make_layout(context_len: int, n: int, settings: MCSettings) -> _Layout:
    total = context_len + n
    if settings.attention == "full":
        return _Layout(total, 0, torch.arange(total), None, continuation_blocks(context_len, n, None))
    b = settings.block_length
    start = (context_len // b) * b
    pos = torch.cat([torch.arange(total), torch.arange(start, total)])
    block = pos // b
    clean = torch.arange(pos.numel()) < total
    same_copy = clean[:, None] == clean[None, :]
    # clean queries: clean keys in blocks <= own; noised queries: clean keys in earlier blocks, noised keys in own block
    mask = torch.where(
        clean[:, None],
        same_copy & (block[None, :] <= block[:, None]),
        (clean[None, :] & (block[None, :] < block[:, None])) | (~clean[None, :] & (block[None, :] == block[:, None])),
    )
    return _Layout(pos.numel(), start, pos, mask, continuation_blocks(context_len, n, b), b)


def _rows(context: list[int], cont: list[int], layout: _Layout, masked: torch.Tensor, mask_id: int) -> torch.Tensor:
    """[rows, length] inputs: one row per mask pattern in ``masked`` [rows, n]."""
    clean = torch.tensor(context + cont, dtype=torch.long)
    n = len(cont)
    noised = clean[layout.noised_start :].repeat(masked.shape[0], 1)
    tail = noised[:, noised.shape[1] - n :]
    noised[:, noised.shape[1] - n :] = torch.where(masked, torch.full_like(tail, mask_id), tail)
    if layout.mask is None:
        return noised
    return torch.cat([clean.repeat(masked.shape[0], 1), noised], dim=1)


class _SharedPrefix:
    """KV cache stand-in: K/V of a few distinct prefixes, shared by every row that continues one of them.

    The first forward (``start == 0``) stores the prefixes' K/V; later forwards see, per row, its
    prefix's K/V followed by their own (``index`` maps rows to prefixes). Nothing is written back.
    """

    def __init__(self, num_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.filled = 0
        self.index: torch.Tensor | None = None

    def write(self, layer_idx: int, key: torch.Tensor, value: torch.Tensor, start: int):
        if self.index is None:
            self.keys[layer_idx], self.values[layer_idx] = key, value
            self.filled = key.shape[2]
            return key, value
        if start != self.filled:
            raise ValueError(f"suffix forward at column {start}, but the shared prefix has {self.filled} columns")
        return (torch.cat([self.keys[layer_idx][self.index], key], dim=2),
                torch.cat([self.values[layer_idx][self.index], value], dim=2))

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.filled


@torch.no_grad()
def _forward(model, inputs: torch.Tensor, layout: _Layout, targets: torch.Tensor, mask_id: int):
    """Per row and continuation position: log p(target) and the greedy token (mask excluded), both [rows, n].

    In block mode the clean blocks before the continuation are computed once per distinct prefix
    (block-causal, as in the one-shot layout) and the rows forward only the rest against them.
    Only these two small tensors leave the device, never the [rows, n, vocab] logits.
    """
    device = model.device
    rows, n = targets.shape
    p = layout.prefix_len
    cache, kwargs = None, {}
    if layout.mask is not None:
        if p:
            prefixes, index = torch.unique(inputs[:, :p], dim=0, return_inverse=True)
            cache = _SharedPrefix(model.config.num_hidden_layers)
            prefix_positions = torch.arange(p)[None].expand(len(prefixes), -1).to(device)
            model(input_ids=prefixes.to(device), position_ids=prefix_positions, block_length=layout.block_length,
                  past_key_values=cache, cache_start=0, logits_to_keep=1)
            cache.index = index.to(device)
            kwargs = dict(past_key_values=cache, cache_start=p)
        kwargs["attention_mask"] = layout.mask[p:][None, None].expand(rows, 1, -1, -1).to(device)
    positions = layout.position_ids[p:][None].expand(rows, -1).to(device)
    logits = model(input_ids=inputs[:, p:].to(device), position_ids=positions, logits_to_keep=n, **kwargs).logits
    logits = logits.float()
    token_logp = logits.gather(-1, targets.to(device)[..., None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    logits[..., mask_id] = float("-inf")
    return token_logp.cpu(), logits.argmax(dim=-1).cpu()


def _packed(items: list[tuple[int, torch.Tensor]], max_rows: int) -> Iterator[list[tuple[int, int, int]]]:
    """Split (request index, rows) items into forwards of at most ``max_rows`` rows: (index, lo, hi) slices."""
    chunk, used = [], 0
    for idx, rows in items:
        lo = 0
        while lo < rows.shape[0]:
            take = min(rows.shape[0] - lo, max_rows - used)
            chunk.append((idx, lo, lo + take))
            used += take
            lo += take
            if used == max_rows:
                yield chunk
                chunk, used = [], 0
    if chunk:
        yield chunk


def mc_loglikelihood(
    model, requests: Sequence[tuple[list[int], list[int]]], settings: MCSettings, progress=None
) -> list[tuple[float, bool]]:
    """``(log-likelihood estimate, is_greedy)`` for each ``(context tokens, continuation tokens)``."""
    results: list[tuple[float, bool] | None] = [None] * len(requests)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (context, cont) in enumerate(requests):
        if not cont:
            results[i] = (0.0, True)
            if progress is not None:
                progress(1)
        else:
            groups.setdefault((len(context), len(cont)), []).append(i)
    for (context_len, n), members in groups.items():
        layout = make_layout(context_len, n, settings)
        # Each request contributes mc_num sample rows then one greedy row (everything masked).
        items, patterns = [], {}
        for i in members:
            generator = torch.Generator().manual_seed(request_seed(settings.seed, requests[i][0]))
            masked, weight = draw_masks(n, layout.blocks, settings.mc_num, generator)
            masked = torch.cat([masked, torch.ones(1, n, dtype=torch.bool)])
            patterns[i] = (masked, weight)
            items.append((i, masked))
        partial: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {i: [] for i in members}
        for chunk in _packed(items, settings.max_rows):
            inputs = torch.cat([
                _rows(list(requests[i][0]), list(requests[i][1]), layout, patterns[i][0][lo:hi], settings.mask_token_id)
                for i, lo, hi in chunk
            ])
            targets = torch.cat([torch.tensor(list(requests[i][1]), dtype=torch.long).expand(hi - lo, n)
                                 for i, lo, hi in chunk])
            token_logp, greedy = _forward(model, inputs, layout, targets, settings.mask_token_id)
            at = 0
            for i, lo, hi in chunk:
                partial[i].append((token_logp[at : at + hi - lo], greedy[at : at + hi - lo]))
                at += hi - lo
                if hi == patterns[i][0].shape[0]:  # the request's last rows arrived: finish it
                    parts = partial.pop(i)
                    results[i] = _finish(torch.cat([t for t, _ in parts]), torch.cat([g for _, g in parts]),
                                         requests[i][1], patterns[i][1])
                    if progress is not None:
                        progress(1)
    return results  # type: ignore[return-value]


def _finish(token_logp: torch.Tensor, greedy: torch.Tensor, cont: Sequence[int], weight: torch.Tensor):
    """Rows 0..mc_num-1 are the samples, the last row is the all-masked greedy pass."""
    estimate = (token_logp[:-1].double() * weight).sum(dim=1).mean()
    target = torch.tensor(list(cont), dtype=torch.long)
    return float(estimate), bool((greedy[-1] == target).all())
