"""The seam between the MoE block's math and where experts live.

The MoE block routes tokens, then hands the routed-expert computation to an *experts executor*:
``executor(moe_block, hidden_states, topk_ids, topk_weights) -> routed output``. The resident
executor below runs all active experts of a layer as two grouped GEMMs (gate and up fused, then
down) over tokens sorted by expert once; the offload runtime installs another executor that runs
the same grouped kernel over the GPU slot pool and over the host store for CPU misses. Both use
the helpers here (pair sorting, the grouped SwiGLU, the weighted combine), so the offloaded path
does the same math in the same order.

Which equalities hold, exactly:

- resident (grouped) == offloaded, bit for bit, on one device: the same kernel on the same rows
  in the same order (a stable sort gives each expert's GEMM identical inputs whether the group key
  is the expert id or its slot). Tests assert this with ``torch.equal``.
- grouped == :class:`LoopExpertsExecutor` (three GEMMs per expert, as the official ``moe_infer``
  runs them) and == the official code: within rounding, not bit for bit. The grouped call fuses
  gate and up into one GEMM of width ``2I``, which the CPU (and CUDA) matmul may block and round
  differently from two GEMMs of width ``I`` for some expert/row combinations; how often depends on
  the ISA (AVX2 vs AVX-512) and the shapes. Measured max-abs-diff on logits (random prompts of 32
  to 256 tokens, 2026-12-02, AVX-512 CPU): bf16 at most 0.0625 (one bf16 ulp at |logit| < 16; the
  long toy against the official code: 0.03125), fp32 at most 3e-5. No generated token changed in
  any comparison (issue 28). Tests compare these with a stated tolerance.

Why grouped: a Python loop over active experts (three GEMMs each) costs ~20 us of host time per
expert, ~60 experts x 19 layers per iteration at LLaDA2.0-mini scale; one grouped call per
projection costs the same arithmetic and a few launches. ``torch.nn.functional.grouped_mm`` runs
on CUDA and on the CPU. :class:`LoopExpertsExecutor` keeps the per-expert loop as the reference
the tests compare against, and is the fallback where this torch has no grouped GEMM for the
device and dtype.

The per-expert ``nn.Linear`` modules keep their official parameter names (official checkpoints
load unrenamed). On the first grouped forward the block's weights are copied once into two
stacked per-layer buffers, ``gate_up [E, 2I, H]`` and ``down [E, H, I]`` (:class:`ExpertBank`),
and every per-expert parameter becomes a view into them: no copy per forward, one copy in memory.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

_GROUPED_MM = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


# --------------------------------------------------------------------------- pair sorting
@dataclass
class TokenGroups:
    """Routing pairs sorted by expert: expert ``experts[i]`` handles rows ``offsets[i]:offsets[i+1]``.

    Host lists (a device sync): for the per-expert reference loop and training code only.
    """

    order: torch.Tensor  # [T*k] pair index (t*k + j) in expert-sorted order
    token_index: torch.Tensor  # [T*k] token row of each sorted pair
    experts: list[int]  # experts with at least one token, ascending
    counts: list[int]  # tokens per expert in `experts`
    offsets: list[int]  # len(experts) + 1 prefix sums of counts

    def rows(self, i: int) -> slice:
        return slice(self.offsets[i], self.offsets[i + 1])


def group_tokens_by_expert(topk_ids: torch.Tensor) -> TokenGroups:
    """Sort the (token, slot) pairs by expert id, once per layer forward (host lists: syncs)."""
    k = topk_ids.shape[-1]
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    ids, counts = torch.unique_consecutive(flat[order], return_counts=True)
    experts, counts_list = ids.tolist(), counts.tolist()
    offsets = [0]
    for c in counts_list:
        offsets.append(offsets[-1] + c)
    return TokenGroups(order, order // k, experts, counts_list, offsets)


@dataclass
class GroupedPairs:
    """Routing pairs sorted by group key for one grouped call; device tensors only (no sync).

    Group ``g`` holds sorted rows ``offs[g-1]:offs[g]``. A stable sort keeps each group's pairs in
    pair order, so a group's rows are the same whether the key is the expert id (resident) or the
    slot holding that expert (offloaded): each expert's GEMM sees identical inputs either way.
    """

    order: torch.Tensor  # [P] pair index of each sorted row
    token_index: torch.Tensor  # [P] token row of each sorted pair
    offs: torch.Tensor  # [G] int32 cumulative pair counts (grouped_mm's ``offs``)


def sort_pairs(keys: torch.Tensor, num_groups: int, k: int) -> GroupedPairs:
    """Sort flat pair keys (values in ``[0, num_groups]``; ``num_groups`` = not in this call, last).

    The group offsets come from the sorted keys (``searchsorted``), not ``bincount``: on CUDA
    ``bincount`` reads the largest key back to the host, a sync per MoE layer.
    """
    order = torch.argsort(keys, stable=True)
    bounds = torch.arange(1, num_groups + 1, device=keys.device, dtype=keys.dtype)
    return GroupedPairs(order, order // k, torch.searchsorted(keys[order], bounds, out_int32=True))


# --------------------------------------------------------------------------- expert math
def swiglu_expert(
    x: torch.Tensor, gate_proj: torch.Tensor, up_proj: torch.Tensor, down_proj: torch.Tensor
) -> torch.Tensor:
    """``down(silu(gate(x)) * up(x))`` with weights stored ``[out, in]`` as in the checkpoint."""
    return F.linear(F.silu(F.linear(x, gate_proj)) * F.linear(x, up_proj), down_proj)


def grouped_swiglu(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """SwiGLU of every group at once: ``gate_up [G, 2I, H]`` (gate rows, then up rows), ``down [G, H, I]``.

    Weights are ``[out, in]`` per group (the checkpoint's layout, any batch stride); ``x`` holds the
    groups' rows back to back as ``offs`` says. Two grouped GEMMs, gate and up fused.
    """
    inter = down.shape[-1]
    gu = _GROUPED_MM(x, gate_up.transpose(1, 2), offs=offs)
    return _GROUPED_MM(F.silu(gu[:, :inter]) * gu[:, inter:], down.transpose(1, 2), offs=offs)


@functools.cache
def grouped_supported(device_type: str, dtype: torch.dtype) -> bool:
    """Whether this torch runs a grouped GEMM for the device type and dtype (probed once)."""
    if _GROUPED_MM is None:
        return False
    try:
        w = torch.zeros(2, 32, 16, device=device_type, dtype=dtype)
        offs = torch.tensor([8, 16], dtype=torch.int32, device=device_type)
        grouped_swiglu(torch.zeros(16, 16, device=device_type, dtype=dtype), w, w[:, :16].transpose(1, 2), offs)
        return True
    except (RuntimeError, NotImplementedError, TypeError):
        return False


def combine_pairs(per_pair: torch.Tensor, topk_weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Weighted sum over each token's k experts, in the router's dtype (fp32), then cast back.

    ``per_pair`` holds each (token, slot) pair's expert output in pair order (``t*k + j``). This is
    the order the official ``moe_infer`` uses: per-pair outputs in the activation dtype, multiplied
    by fp32 gate weights, summed over k, cast to the activation dtype.
    """
    t, k = topk_weights.shape
    weighted = per_pair.view(t, k, -1).to(topk_weights.dtype) * topk_weights.unsqueeze(-1)
    return weighted.sum(dim=1).to(dtype)


def combine_expert_outputs(
    groups: TokenGroups | GroupedPairs, sorted_outputs: torch.Tensor, topk_weights: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """:func:`combine_pairs` of expert-sorted outputs (scattered back to pair order first)."""
    per_pair = torch.empty_like(sorted_outputs)
    per_pair[groups.order] = sorted_outputs
    return combine_pairs(per_pair, topk_weights, dtype)


# --------------------------------------------------------------------------- stacked weights
@dataclass
class ExpertBank:
    """One MoE layer's routed experts stacked once: ``gate_up [E, 2I, H]``, ``down [E, H, I]``.

    The per-expert parameters are views into these buffers (same Parameter objects, same names),
    so weights loaded or edited in place are what the grouped kernel reads.
    """

    gate_up: torch.Tensor
    down: torch.Tensor

    @classmethod
    @torch.no_grad()
    def adopt(cls, experts: torch.nn.ModuleList) -> ExpertBank:
        """Copy the experts' weights into stacked buffers and re-point each parameter at its view."""
        first = experts[0]
        inter, hidden = first.gate_proj.weight.shape
        like = dict(dtype=first.gate_proj.weight.dtype, device=first.gate_proj.weight.device)
        gate_up = torch.empty(len(experts), 2 * inter, hidden, **like)
        down = torch.empty(len(experts), hidden, inter, **like)
        for e, mod in enumerate(experts):
            gate_up[e, :inter].copy_(mod.gate_proj.weight)
            gate_up[e, inter:].copy_(mod.up_proj.weight)
            down[e].copy_(mod.down_proj.weight)
            mod.gate_proj.weight.data = gate_up[e, :inter]
            mod.up_proj.weight.data = gate_up[e, inter:]
            mod.down_proj.weight.data = down[e]
        return cls(gate_up, down)

    def backs(self, experts: torch.nn.ModuleList) -> bool:
        """Whether the experts' parameters are still views into this bank.

        Checks the first and last expert only (cheap on the hot path): ``model.to(...)`` or a
        reload re-creates every parameter, and is caught; whoever swaps one expert's Parameter
        object by hand must drop the bank (``moe_block._expert_bank = None``).
        """
        first, last = experts[0], experts[-1]
        return (len(experts) == self.gate_up.shape[0]
                and first.gate_proj.weight.data_ptr() == self.gate_up.data_ptr()
                and last.down_proj.weight.data_ptr() == self.down[-1].data_ptr()
                and first.gate_proj.weight.dtype == self.gate_up.dtype)


def expert_bank(moe_block: torch.nn.Module) -> ExpertBank:
    """The block's stacked expert weights, built on first use (and rebuilt if the params moved)."""
    bank = getattr(moe_block, "_expert_bank", None)
    if bank is None or not bank.backs(moe_block.experts):
        bank = ExpertBank.adopt(moe_block.experts)
        moe_block._expert_bank = bank  # a plain attribute: not in the state_dict
    return bank


# --------------------------------------------------------------------------- executors
class ExpertsExecutor(Protocol):
    """Computes ``sum_k w_k * E_{ids_k}(x)`` for every token of one MoE layer."""

    def __call__(
        self,
        moe_block: torch.nn.Module,
        hidden_states: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
    ) -> torch.Tensor: ...


class LoopExpertsExecutor:
    """The reference: a Python loop over the experts that received tokens, three GEMMs each."""

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


class ModuleExpertsExecutor:
    """The loop, calling each routed expert as a module: for weights accelerate offloaded.

    With ``device_map`` and "disk" or "cpu" offload, accelerate leaves the expert weights on the
    meta device and loads them in each module's forward hook; reading ``.weight`` directly (the
    bank, :class:`LoopExpertsExecutor`) would see no data. ``down(silu(gate(x)) * up(x))`` as the
    modules compute it is :func:`swiglu_expert`'s math.
    """

    def __call__(self, moe_block, hidden_states, topk_ids, topk_weights):
        groups = group_tokens_by_expert(topk_ids)
        sorted_x = hidden_states[groups.token_index]
        outputs = torch.empty_like(sorted_x)
        for i, expert_id in enumerate(groups.experts):
            rows = groups.rows(i)
            outputs[rows] = moe_block.experts[expert_id](sorted_x[rows])
        return combine_expert_outputs(groups, outputs, topk_weights, hidden_states.dtype)


class ResidentExpertsExecutor:
    """Every expert is a module of the block: all of them in one grouped SwiGLU over the bank.

    With autograd recording (training) the weights are stacked from the parameters per call, so
    gradients reach them; otherwise the stacked bank is used as is. No host sync either way.
    """

    loop = LoopExpertsExecutor()
    modules = ModuleExpertsExecutor()

    def __call__(self, moe_block, hidden_states, topk_ids, topk_weights):
        experts = moe_block.experts
        if experts[0].gate_proj.weight.device.type == "meta":  # accelerate offloaded them (device_map + disk/cpu)
            return self.modules(moe_block, hidden_states, topk_ids, topk_weights)
        if not grouped_supported(hidden_states.device.type, hidden_states.dtype):
            return self.loop(moe_block, hidden_states, topk_ids, topk_weights)
        if torch.is_grad_enabled() and experts[0].gate_proj.weight.requires_grad:
            gate_up = torch.stack([torch.cat([m.gate_proj.weight, m.up_proj.weight]) for m in experts])
            down = torch.stack([m.down_proj.weight for m in experts])
        else:
            bank = expert_bank(moe_block)
            gate_up, down = bank.gate_up, bank.down
        pairs = sort_pairs(topk_ids.reshape(-1), len(experts), topk_ids.shape[-1])
        out = grouped_swiglu(hidden_states[pairs.token_index], gate_up, down, pairs.offs)
        return combine_expert_outputs(pairs, out, topk_weights, hidden_states.dtype)


RESIDENT_EXECUTOR = ResidentExpertsExecutor()
LOOP_EXECUTOR = RESIDENT_EXECUTOR.loop
