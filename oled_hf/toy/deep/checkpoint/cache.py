"""KV cache for block diffusion: the committed prefix plus the block being denoised.

Each forward over canvas columns ``[start, start + L)`` writes its K/V into those columns and
attends over ``[0, start + L)``. Denoising iterations rewrite the current block's columns every
time; once the block is final, one refresh forward writes its clean K/V and the block becomes
prefix. This is dInfer's ``replace_position`` scheme: attending over ``[0, end)`` with no mask
equals the block-causal mask because nothing after the block is ever in the cache.
"""

from __future__ import annotations

import torch


class BlockKVCache:
    """Preallocated per-layer K/V buffers ``[batch, kv_heads, capacity, head_dim]``."""

    def __init__(self, num_layers: int, capacity: int | None = None):
        self.num_layers = num_layers
        self.capacity = capacity
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.filled = 0  # highest column written so far (exclusive)

    def write(
        self, layer_idx: int, key: torch.Tensor, value: torch.Tensor, start: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store K/V at ``[start, start+L)`` and return views over ``[0, start+L)``."""
        end = start + key.shape[2]
        if start > self.filled and layer_idx == 0:
            raise ValueError(f"cache write at column {start} leaves a gap: only {self.filled} columns are filled")
        buf_k, buf_v = self.keys[layer_idx], self.values[layer_idx]
        if buf_k is None or buf_k.shape[2] < end or buf_k.shape[0] != key.shape[0]:
            buf_k, buf_v = self._grow(buf_k, buf_v, key, end)
            self.keys[layer_idx], self.values[layer_idx] = buf_k, buf_v
        buf_k[:, :, start:end] = key
        buf_v[:, :, start:end] = value
        if layer_idx == self.num_layers - 1:
            self.filled = max(self.filled, end)
        return buf_k[:, :, :end], buf_v[:, :, :end]

    def _grow(self, buf_k, buf_v, like: torch.Tensor, end: int):
        size = max(end, self.capacity or 0)
        if buf_k is not None and buf_k.shape[0] == like.shape[0]:
            size = max(size, 2 * buf_k.shape[2])
        shape = (like.shape[0], like.shape[1], size, like.shape[3])
        new_k = like.new_zeros(shape)
        new_v = like.new_zeros(shape)
        if buf_k is not None and buf_k.shape[0] == like.shape[0]:
            new_k[:, :, : buf_k.shape[2]] = buf_k
            new_v[:, :, : buf_v.shape[2]] = buf_v
        return new_k, new_v

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.filled

    def crop(self, length: int) -> None:
        """Forget columns at and after ``length`` (they will be rewritten before being attended)."""
        self.filled = min(self.filled, length)
