"""Routing and CPU-expert data between the device and the host: one transfer each, through pinned buffers.

The routing of a planned layer comes to the host in one transfer (ids and, if the policy reads them,
fp32 gate weights bit-cast into one int32 tensor): the layer's one host sync. On CUDA every transfer
goes through a pinned buffer the layer keeps (:class:`HostBuffers`), so a forward allocates no
page-locked memory; on a CPU device the tensors are the host's already (views, no copy).
"""

from __future__ import annotations

import numpy as np
import torch


def pack_routing(topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
    """Ids and fp32 gate weights as one int32 ``[T, 2k]`` tensor (weights bit-cast): one transfer."""
    return torch.cat([topk_ids.to(torch.int32), topk_weights.float().view(torch.int32)], dim=-1)


def unpack_routing(packed: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    return packed[:, :k], np.ascontiguousarray(packed[:, k:]).view(np.float32)


def host_routing(topk_ids: torch.Tensor, topk_weights: torch.Tensor, need_weights: bool):
    """The routing as NumPy on a host device (views on the CPU): no transfer, nothing to wait for."""
    def to_np(t: torch.Tensor) -> np.ndarray:
        return t.detach().numpy() if t.device.type == "cpu" else t.detach().cpu().numpy()
    return to_np(topk_ids), to_np(topk_weights) if need_weights else None


def routing_to_host(backend, topk_ids: torch.Tensor, topk_weights: torch.Tensor, need_weights: bool,
                    buffer: torch.Tensor | None = None):
    """The routing on the host now (ids and, if needed, gate weights in one transfer): one counted host sync.

    On CUDA through the pinned ``buffer`` (shape of the packed routing) and an event; the arrays
    are copied out of it, so the buffer may be reused at once.
    """
    if not backend.cuda:
        backend.count_sync()
        return host_routing(topk_ids, topk_weights, need_weights)
    if not need_weights:
        return backend.to_host(topk_ids, buffer).copy(), None
    packed = backend.to_host(pack_routing(topk_ids, topk_weights), buffer)
    ids, weights = unpack_routing(packed, topk_ids.shape[-1])
    return ids.copy(), weights.copy()


class HostBuffers:
    """One layer's pinned transfer buffers, kept and grown, so a forward allocates none (CUDA)."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self.buffers: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        numel = int(np.prod(shape))
        buf = self.buffers.get((name, dtype))
        if buf is None or buf.numel() < numel:
            size = max(numel, 2 * buf.numel() if buf is not None else numel)
            buf = self.buffers[(name, dtype)] = self.backend.pinned((size,), dtype)
        return buf[:numel].view(shape)
