"""The iteration-event interface between the block-diffusion decoder and whoever listens.

The decoder emits one :class:`IterationEvent` per denoising iteration (after it has computed
confidences and committed tokens) and brackets every block with ``on_block_start`` /
``on_block_end``. Listeners (the expert-retention policy, the trace recorder, streamers, stats)
subclass :class:`IterationObserver` and override only what they need. This module sits in
``generation`` so that the offload runtime depends on the decoder's vocabulary, never the reverse.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class IterationEvent:
    """What one denoising iteration did to the current block (all tensors ``[batch, B]``)."""

    block_index: int  # absolute block index on the canvas
    iteration: int  # 0-based iteration within the block
    masked: torch.Tensor  # bool: masked at the start of this iteration
    confidence: torch.Tensor  # float32: p(argmax) at positions masked at start, else 1.0 (decoded)
    committed: torch.Tensor  # bool: committed in this iteration
    token_ids: torch.Tensor  # long: block tokens after this iteration's commits and edits
    # bool: decoded tokens replaced in this iteration (LLaDA2.1 editing); None from producers that
    # predate editing (read as no edits). Edited positions are neither masked nor committed.
    edited: torch.Tensor | None = None

    def edited_or_none(self) -> torch.Tensor:
        """``edited``, or all False where the producer recorded no edits."""
        return self.edited if self.edited is not None else torch.zeros_like(self.committed)


class IterationObserver:
    """Base listener with no-op hooks; subclasses override what they need."""

    def on_block_start(self, block_index: int, token_ids: torch.Tensor) -> None:
        """A new block begins; ``token_ids`` is the block as it enters decoding (all masks)."""

    def on_iteration(self, event: IterationEvent) -> None:
        """One denoising iteration finished (its forward has already run)."""

    def on_block_end(self, block_index: int, token_ids: torch.Tensor) -> None:
        """The block is fully decoded (after its KV-refresh forward, if any)."""

    def on_forward(self, kind: str, block_index: int, iteration: int) -> None:
        """A model forward is about to run: ``prefill``, ``denoise`` or ``refresh`` (iteration -1 for prefill)."""

    def on_generate_end(self) -> None:
        """The ``generate`` call finished (trace recorders save here)."""
