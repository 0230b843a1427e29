import torch
from oled_hf.modeling.attention_mask import block_causal_mask
from oled_hf.modeling.cache import BlockKVCache
from oled_hf.modeling.experts import RESIDENT_EXECUTOR


def _ids(n, seed=0):
    return torch.randint(0, 500, (1, n), generator=torch.Generator().manual_seed(seed))


def test_block_causal_mask_uses_absolute_blocks():
    mask = block_causal_mask(query_start=8, query_len=8, key_len=16, block_length=8, device="cpu")
    assert mask.all()  # block 1 sees blocks 0 and 1
    mask = block_causal_mask(0, 12, 12, 8, "cpu")
    assert mask[:8, :8].all() and not mask[:8, 8:].any() and mask[8:, :].all()


@torch.no_grad()
def test_prompt_ending_mid_block_sees_its_whole_block_only(tiny_model):
    # 13 tokens, B=8: block 0 = [0,8), block 1 = [8,16). Position 9 (mid-block) sees 10..12 but
    # changing block 1 never changes block 0's logits.
    ids = _ids(13)
    base = tiny_model(ids, block_length=8).logits
    changed = ids.clone()
    changed[0, 12] = (changed[0, 12] + 1) % 500
    other = tiny_model(changed, block_length=8).logits
    # Equal up to rounding: experts batch different token sets when block 1 changes.
    torch.testing.assert_close(base[:, :8], other[:, :8], rtol=0, atol=1e-5)
    assert (base[:, 8:12] - other[:, 8:12]).abs().max() > 1e-3
    full = tiny_model(changed).logits  # no block mask: fully bidirectional
    assert (full[:, :8] - other[:, :8]).abs().max() > 1e-3


@torch.no_grad()
def test_cached_block_forward_equals_full_forward(tiny_model):
    ids = _ids(40, seed=1)
    full = tiny_model(ids, block_length=8).logits
    cache = BlockKVCache(tiny_model.config.num_hidden_layers)
    prefix = tiny_model(ids[:, :16], past_key_values=cache, block_length=8).logits
    torch.testing.assert_close(prefix, full[:, :16], rtol=1e-5, atol=1e-5)
    for start in (16, 24, 32):
        block = tiny_model(ids[:, start:start + 8], past_key_values=cache, cache_start=start).logits
        torch.testing.assert_close(block, full[:, start:start + 8], rtol=1e-5, atol=1e-5)
        assert block.argmax(-1).equal(full[:, start:start + 8].argmax(-1))


@torch.no_grad()
def test_cached_iteration_rewrites_its_block(tiny_model):
    ids = _ids(24, seed=2)
    cache = BlockKVCache(tiny_model.config.num_hidden_layers)
    tiny_model(ids[:, :16], past_key_values=cache, block_length=8)
    noisy = torch.full((1, 8), tiny_model.config.mask_token_id)
    tiny_model(noisy, past_key_values=cache, cache_start=16)  # an iteration over masks
    final = tiny_model(ids[:, 16:24], past_key_values=cache, cache_start=16).logits
    full = tiny_model(ids, block_length=8).logits
    torch.testing.assert_close(final, full[:, 16:], rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_router_outputs_per_moe_layer(tiny_model):
    out = tiny_model(_ids(10), output_router_logits=True)
    cfg = tiny_model.config
    assert len(out.router_logits) == cfg.num_hidden_layers - cfg.first_k_dense_replace
    logits, ids = out.router_logits[0]
    assert logits.shape == (1, 10, cfg.num_experts) and ids.shape == (1, 10, cfg.num_experts_per_tok)
    torch.testing.assert_close(out.router_weights[0].sum(-1), torch.full((1, 10), cfg.routed_scaling_factor))
    assert tiny_model(_ids(10)).router_logits is None


@torch.no_grad()
def test_executor_seam_and_only_routed_experts_run(tiny_model):
    calls = []
    block = tiny_model.moe_blocks()[0]

    class Recording:
        def __call__(self, moe, x, ids, w):
            calls.append((moe.layer_idx, ids.clone()))
            return RESIDENT_EXECUTOR(moe, x, ids, w)

    ran = set()
    hooks = [e.register_forward_pre_hook(lambda m, a, i=i: ran.add(i)) for i, e in enumerate(block.experts)]
    block.experts_executor = Recording()
    try:
        ids = _ids(3)
        a = tiny_model(ids).logits
    finally:
        block.experts_executor = RESIDENT_EXECUTOR
        for h in hooks:
            h.remove()
    assert len(calls) == 1 and calls[0][0] == block.layer_idx
    assert ran == set()  # the resident executor uses the weights directly, no per-expert module call
    torch.testing.assert_close(a, tiny_model(ids).logits, rtol=0, atol=0)


@torch.no_grad()
def test_padding_mask_keeps_rows_finite(tiny_model):
    ids = _ids(16)
    pad = torch.ones(1, 16, dtype=torch.long)
    pad[0, :9] = 0  # the first block is entirely padding
    out = tiny_model(ids, attention_mask=pad, block_length=8).logits
    assert torch.isfinite(out).all()
