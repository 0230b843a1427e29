"""Grouped expert execution: equal to the per-expert loop within rounding, weights shared with the modules.

The grouped kernel fuses gate and up into one GEMM, which may round differently from the loop's two
(how often depends on the CPU's ISA), so these compare with a stated tolerance (modeling/experts.py
docstring); only the same kernel on both sides (resident vs offloaded, saved vs reloaded) is exact.
"""

import pytest
import torch
from oled_hf.modeling import OledLLaDA2ForDiffusionLM
from oled_hf.modeling.experts import (
    LOOP_EXECUTOR,
    RESIDENT_EXECUTOR,
    expert_bank,
    grouped_supported,
    grouped_swiglu,
    sort_pairs,
    swiglu_expert,
)

# Per-element tolerances: fp32 a few ulps after accumulation; bf16 logits one bf16 ulp below 16 (the bound
# the experts docstring states), bf16 single-layer outputs torch's default bf16 tolerance.
LOGITS_TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.bfloat16: dict(rtol=0.0, atol=0.0625)}
SWIGLU_TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2)}

pytestmark = pytest.mark.skipif(not grouped_supported("cpu", torch.float32), reason="torch has no CPU grouped GEMM")


def _set(model, executor):
    for block in model.moe_blocks():
        block.experts_executor = executor


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_swiglu_equals_loop_with_empty_and_single_row_groups(dtype):
    g, h, i = 6, 64, 32
    gen = torch.Generator().manual_seed(0)
    gate_up = torch.randn(g, 2 * i, h, generator=gen).to(dtype)
    down = torch.randn(g, h, i, generator=gen).to(dtype)
    counts = [3, 0, 1, 7, 0, 2]
    x = torch.randn(sum(counts), h, generator=gen).to(dtype)
    offs = torch.tensor(counts).cumsum(0).to(torch.int32)
    out = grouped_swiglu(x, gate_up, down, offs)
    start = 0
    for e, c in enumerate(counts):
        ref = swiglu_expert(x[start:start + c], gate_up[e, :i], gate_up[e, i:], down[e])
        torch.testing.assert_close(out[start:start + c], ref, **SWIGLU_TOL[dtype], msg=f"group {e}")
        start += c


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_resident_logits_and_tokens_equal_loop(tiny_path, tiny_tokenizer, dtype):
    model = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, dtype=dtype).eval()
    ids = torch.randint(0, 500, (2, 24), generator=torch.Generator().manual_seed(0))
    prompt = tiny_tokenizer.apply_chat_template([{"role": "user", "content": "hello there"}],
                                                add_generation_prompt=True, return_tensors="pt", return_dict=True)
    results = []
    for executor in (LOOP_EXECUTOR, RESIDENT_EXECUTOR):
        _set(model, executor)
        with torch.no_grad():
            logits = model(ids, block_length=8).logits
        tokens = model.generate(**prompt, max_new_tokens=24, block_length=8, threshold=0.9)
        results.append((logits, tokens))
    torch.testing.assert_close(results[0][0], results[1][0], **LOGITS_TOL[dtype])
    assert torch.equal(results[0][1], results[1][1])  # measured: no token changes on this checkpoint


def test_bank_is_shared_with_parameters_and_state_dict_is_unchanged(tiny_path, tmp_path):
    model = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path).eval()
    keys = list(model.state_dict())
    ids = torch.randint(0, 500, (1, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(ids, block_length=8).logits
    block = model.moe_blocks()[0]
    bank = expert_bank(block)
    inter = model.config.moe_intermediate_size
    assert block.experts[3].up_proj.weight.data_ptr() == bank.gate_up[3, inter:].data_ptr()
    assert block.experts[5].down_proj.weight.data_ptr() == bank.down[5].data_ptr()
    assert list(model.state_dict()) == keys
    with torch.no_grad():  # in-place edits of a parameter are what the grouped kernel reads
        block.experts[0].gate_proj.weight.mul_(1.5)
        assert torch.equal(bank.gate_up[0, :inter], block.experts[0].gate_proj.weight)
        block.experts[0].gate_proj.weight.div_(1.5)
    model.save_pretrained(tmp_path / "saved")  # views of one buffer: transformers clones them on save
    again = OledLLaDA2ForDiffusionLM.from_pretrained(tmp_path / "saved").eval()
    with torch.no_grad():
        assert torch.equal(again(ids, block_length=8).logits, model(ids, block_length=8).logits)
        model.to(torch.bfloat16)  # every parameter re-created: the bank is rebuilt, not stale
        _set(model, LOOP_EXECUTOR)
        loop = model(ids, block_length=8).logits
        _set(model, RESIDENT_EXECUTOR)
        torch.testing.assert_close(model(ids, block_length=8).logits, loop, **LOGITS_TOL[torch.bfloat16])
        assert expert_bank(block).gate_up.dtype == torch.bfloat16
    assert before.dtype == torch.float32


def test_gradients_reach_expert_parameters(tiny_path):
    model = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path)
    ids = torch.randint(0, 500, (1, 16), generator=torch.Generator().manual_seed(2))
    grads = []
    for executor in (LOOP_EXECUTOR, RESIDENT_EXECUTOR):
        _set(model, executor)
        model.zero_grad()
        model(ids, block_length=8).logits.square().mean().backward()
        g = [e.up_proj.weight.grad for e in model.moe_blocks()[0].experts]
        grads.append(torch.stack([x if x is not None else torch.zeros_like(e.up_proj.weight)
                                  for x, e in zip(g, model.moe_blocks()[0].experts)]))
    assert grads[1].abs().sum() > 0
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-7)


def test_sort_pairs_offsets_equal_bincount_cumsum():
    """sort_pairs finds its offsets without bincount (a host sync on CUDA): the same integers."""
    keys = torch.randint(0, 41, (96,), generator=torch.Generator().manual_seed(0))  # 40 = not in the call
    keys[keys == 7] = 8  # an empty group
    got = sort_pairs(keys, 40, 4)
    want_offs = torch.cumsum(torch.bincount(keys, minlength=41)[:40], 0, dtype=torch.int32)
    assert torch.equal(got.order, torch.argsort(keys, stable=True)) and torch.equal(got.token_index, got.order // 4)
    assert torch.equal(got.offs, want_offs)
    assert got.offs.dtype == torch.int32
