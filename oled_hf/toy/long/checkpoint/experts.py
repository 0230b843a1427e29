"""The seam between the MoE block's math and where experts live.

The MoE block routes tokens, then hands the routed-expert computation to an *experts executor*:
``executor(moe_block, hidden_states, topk_ids, topk_weights) -> routed output``. The resident
executor below runs experts from the block's own ``nn.ModuleList``; the offload runtime installs
another executor that reads weights from a GPU slot cache or computes misses on the CPU. Both use
the helpers here (token grouping, the SwiGLU, the weighted combine) so the offloaded path does the
same math in the same order and gives bit-identical logits on one device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F


@dataclass
class TokenGroups:
    """Routing pairs sorted by expert: expert ``experts[i]`` handles rows ``offsets[i]:offsets[i+1]``."""

    order: torch.Tensor  # [T*k] pair index (t*k + j) in expert-sorted order
    token_index: torch.Tensor  # [T*k] token row of each sorted pair
    experts: list[int]  # experts with at least one token, ascending
    counts: list[int]  # tokens per expert in `experts`
    offsets: list[int]  # len(experts) + 1 prefix sums of counts

    def rows(self, i: int) -> slice:
        return slice(self.offsets[i], self.offsets[i + 1])


def group_tokens_by_expert(topk_ids: torch.Tensor) -> TokenGroups:
    """Sort the (token, slot) pairs by expert id, once per layer forward."""
    k = topk_ids.shape[-1]
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    ids, counts = torch.unique_consecutive(flat[order], return_counts=True)
    experts, counts_list = ids.tolist(), counts.tolist()
    offsets = [0]
    for c in counts_list:
        offsets.append(offsets[-1] + c)
    return TokenGroups(order, order // k, experts, counts_list, offsets)


def swiglu_expert(
    x: torch.Tensor, gate_proj: torch.Tensor, up_proj: torch.Tensor, down_proj: torch.Tensor
) -> torch.Tensor:
    """``down(silu(gate(x)) * up(x))`` with weights stored ``[out, in]`` as in the checkpoint."""
    return F.linear(F.silu(F.linear(x, gate_proj)) * F.linear(x, up_proj), down_proj)


def combine_expert_outputs(
    groups: TokenGroups, sorted_outputs: torch.Tensor, topk_weights: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Weighted sum over each token's k experts, in the router's dtype (fp32), then cast back.

    This is the order the official ``moe_infer`` uses: per-pair outputs in the activation dtype,
    multiplied by fp32 gate weights, summed over k, cast to the activation dtype.
    """
    t, k = topk_weights.shape
    per_pair = torch.empty_like(sorted_outputs)
    per_pair[groups.order] = sorted_outputs
    weighted = per_pair.view(t, k, -1).to(topk_weights.dtype) * topk_weights.unsqueeze(-1)
    return weighted.sum(dim=1).to(dtype)


class ExpertsExecutor(Protocol):
    """Computes ``sum_k w_k * E_{ids_k}(x)`` for every token of one MoE layer."""

    def __call__(
        self,
        moe_block: torch.nn.Module,
        hidden_states: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
    ) -> torch.Tensor: ...


class ResidentExpertsExecutor:
    """Every expert is a module of the block: loop only over experts that received tokens."""

    def __call__(self, moe_block, hidden_states, topk_ids, topk_weights):
        groups = group_tokens_by_expert(topk_ids)
        sorted_x = hidden_states[groups.token_index]
        outputs = torch.empty_like(sorted_x)
        for i, expert_id in enumerate(groups.experts):
            expert = moe_block.experts[expert_id]
            rows = groups.rows(i)
            outputs[rows] = swiglu_expert(
                sorted_x[rows], expert.gate_proj.weight, expert.up_proj.weight, expert.down_proj.weight
            )
        return combine_expert_outputs(groups, outputs, topk_weights, hidden_states.dtype)


RESIDENT_EXECUTOR = ResidentExpertsExecutor()
