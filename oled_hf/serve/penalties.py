"""OpenAI's ``presence_penalty`` and ``frequency_penalty`` for block diffusion, as a logits processor.

OpenAI's definition, per token ``t`` of the vocabulary, with ``count[t]`` the times ``t`` occurs in
the completion generated so far (the prompt is not counted)::

    logit[t] -= presence_penalty * (count[t] > 0) + frequency_penalty * count[t]

both in [-2, 2]; positive values discourage repeats, negative ones encourage them. In block
diffusion "generated so far" is what the row has committed: every generated token of its earlier
blocks, and the positions of the current block already decoded, wherever they sit in the block
(the whole block is chosen together, so a token committed after position ``j`` is as much
"already said" as one before it). The penalty is the same at every position of the block, as the
decoder's own ``repetition_penalty`` is (``modeling/generation_oled_llada2.py``).

Why the processor is also an iteration observer: ``generate`` hands a logits processor, for block
position ``j``, only the canvas before ``j``, so a token committed later in the block would be
invisible to the positions before it; the decoder's :class:`IterationEvent` carries the whole
block after each iteration's commits (and edits), and ``on_block_start`` tells generated positions
(masked when the block starts) from the prompt's tail. Pass the same object as
``logits_processor=[p]`` and ``observers=[p]``.

What it cannot do: tokens committed in the same iteration are chosen from one forward and do not
see each other, so even a huge presence penalty forbids a repeat across iterations, not within
one; and inside the block that holds a row's first EOS, tokens decoded after the EOS (cut from the
answer) are counted too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..modeling.events import IterationEvent, IterationObserver


@dataclass(frozen=True)
class Penalty:
    """One request's penalties (OpenAI's fields); zero for both is no processing at all."""

    presence: float = 0.0
    frequency: float = 0.0

    @property
    def active(self) -> bool:
        return self.presence != 0.0 or self.frequency != 0.0


class PenaltyProcessor(IterationObserver):
    """Subtracts each row's penalties from its logits at every position of the current block.

    ``penalties``: one per batch row, in the batch's order (rows may differ; a row with zeros is
    left exactly as it was). ``vocab_size``: the model's; ``mask_token_id``: the decoder's mask.
    """

    def __init__(self, penalties: list[Penalty], vocab_size: int, mask_token_id: int):
        if not penalties:
            raise ValueError("PenaltyProcessor needs one Penalty per batch row, got none")
        self.rows, self.vocab, self.mask = len(penalties), int(vocab_size), int(mask_token_id)
        self.presence = torch.tensor([p.presence for p in penalties], dtype=torch.float32)[:, None, None]
        self.frequency = torch.tensor([p.frequency for p in penalties], dtype=torch.float32)[:, None, None]
        self.earlier = torch.zeros((self.rows, self.vocab), dtype=torch.float32)  # finished blocks' counts
        self.current = torch.zeros_like(self.earlier)  # the current block's decoded positions
        self.generated: torch.Tensor | None = None  # bool [rows, B]: the block's positions to generate

    # ---- observer: what has been committed ---------------------------------------------------
    def on_block_start(self, block_index: int, token_ids: torch.Tensor) -> None:
        self.generated = token_ids.cpu() == self.mask
        self.current.zero_()

    def on_iteration(self, event: IterationEvent) -> None:
        self.current = self._counts(event.token_ids)

    def on_block_end(self, block_index: int, token_ids: torch.Tensor) -> None:
        self.earlier += self._counts(token_ids)
        self.current.zero_()
        self.generated = None

    def _counts(self, tokens: torch.Tensor) -> torch.Tensor:
        """float [rows, V]: how often each token sits at a decoded generated position of the block."""
        tokens = tokens.cpu()
        generated = self.generated if self.generated is not None else torch.zeros_like(tokens, dtype=torch.bool)
        keep = generated & (tokens != self.mask) & (tokens >= 0) & (tokens < self.vocab)
        counts = torch.zeros((tokens.shape[0], self.vocab + 1), dtype=torch.float32)
        counts.scatter_add_(1, torch.where(keep, tokens, self.vocab), torch.ones_like(tokens, dtype=torch.float32))
        return counts[:, : self.vocab]

    # ---- processor: the penalties ------------------------------------------------------------
    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """``scores`` [rows * B, V] (row-major, as ``generate`` passes them) less each row's penalties."""
        total, width = scores.shape
        if total % self.rows:
            raise ValueError(f"PenaltyProcessor was made for {self.rows} batch rows, but scores has {total} rows")
        counts = (self.earlier + self.current)[:, None, :]
        penalty = self.presence * (counts > 0) + self.frequency * counts  # [rows, 1, V]
        if width != self.vocab:  # a head wider or narrower than the config's vocabulary
            penalty = torch.nn.functional.pad(penalty, (0, max(0, width - self.vocab)))[..., :width]
        out = scores.reshape(self.rows, total // self.rows, width) - penalty.to(scores.device, scores.dtype)
        return out.reshape(total, width)
