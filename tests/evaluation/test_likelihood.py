"""The Monte-Carlo masked-diffusion likelihood: masks, the two-copy block layout, determinism."""

import torch

from oled_hf.evaluation.likelihood import (
    MCSettings,
    _forward,
    _rows,
    continuation_blocks,
    draw_masks,
    make_layout,
    mc_loglikelihood,
)


def test_continuation_blocks_follow_absolute_block_grid():
    assert continuation_blocks(5, 10, 8) == [(0, 3), (3, 10)]
    assert continuation_blocks(8, 4, 8) == [(0, 4)]
    assert continuation_blocks(3, 20, 8) == [(0, 5), (5, 13), (13, 20)]
    assert continuation_blocks(3, 20, None) == [(0, 20)]


def test_masks_hit_every_block_and_weight_by_inverse_ratio():
    blocks = [(0, 3), (3, 10)]
    masked, weight = draw_masks(10, blocks, 200, torch.Generator().manual_seed(0))
    for start, end in blocks:
        counts = masked[:, start:end].sum(1)
        assert bool((counts >= 1).all())
        assert set(counts.tolist()) == set(range(1, end - start + 1))  # l ~ U{1..n_b}
        w = weight[:, start:end]
        expected = (end - start) / counts.double()
        assert torch.allclose(w.max(1).values, expected)
        assert bool((w[~masked[:, start:end]] == 0).all())


def test_two_copy_layout_matches_one_forward_per_block(tiny_model):
    """A noised block sees clean earlier blocks: the same logits as a block-causal forward of that canvas."""
    torch.manual_seed(0)
    mask_id = tiny_model.config.mask_token_id
    b = 8
    context = torch.randint(0, 400, (13,)).tolist()
    cont = torch.randint(0, 400, (9,)).tolist()  # positions 13..21: blocks 1 (13..15) and 2 (16..21)
    settings = MCSettings(mask_token_id=mask_id, block_length=b)
    layout = make_layout(len(context), len(cont), settings)
    assert layout.blocks == [(0, 3), (3, 9)]
    masked = torch.tensor([[1, 0, 1, 0, 1, 1, 0, 1, 0]] * 2, dtype=torch.bool)
    targets = torch.stack([torch.tensor(cont), torch.randint(0, 500, (9,))])  # any token's log-prob
    logp, greedy = _forward(tiny_model, _rows(context, cont, layout, masked, mask_id), layout, targets, mask_id)
    clean = torch.tensor(context + cont)
    for start, end in layout.blocks:
        canvas = clean.clone()
        span = slice(len(context) + start, len(context) + end)
        canvas[span] = torch.where(masked[0, start:end], torch.tensor(mask_id), canvas[span])
        with torch.no_grad():
            ref = tiny_model(input_ids=canvas[None], block_length=b).logits[0, span].float().log_softmax(-1)
        for row in range(2):
            want = ref.gather(-1, targets[row, start:end, None]).squeeze(-1)
            assert torch.allclose(logp[row, start:end], want, atol=1e-4), (start, end)
        ref[:, mask_id] = float("-inf")
        assert torch.equal(greedy[0, start:end], ref.argmax(-1))


def test_full_attention_layout_is_one_bidirectional_forward(tiny_model):
    mask_id = tiny_model.config.mask_token_id
    context, cont = [5, 6, 7, 8], [9, 10, 11]
    settings = MCSettings(mask_token_id=mask_id, attention="full")
    layout = make_layout(len(context), len(cont), settings)
    masked = torch.tensor([[0, 1, 1]], dtype=torch.bool)
    logp, _ = _forward(tiny_model, _rows(context, cont, layout, masked, mask_id), layout, torch.tensor([cont]), mask_id)
    with torch.no_grad():
        ref = tiny_model(input_ids=torch.tensor([[5, 6, 7, 8, 9, mask_id, mask_id]])).logits[0, 4:].log_softmax(-1)
    assert torch.allclose(logp[0], ref.gather(-1, torch.tensor(cont)[:, None]).squeeze(-1), atol=1e-5)


def test_estimate_is_deterministic_and_independent_of_packing(tiny_model):
    mask_id = tiny_model.config.mask_token_id
    reqs = [([1, 2, 3, 4, 5], [6, 7, 8]), ([1, 2, 3, 4, 5], [9, 10, 11]), ([4, 4], [7]), ([3], [])]
    base = MCSettings(mask_token_id=mask_id, mc_num=6, seed=3, block_length=4)
    a = mc_loglikelihood(tiny_model, reqs, base)
    assert a == mc_loglikelihood(tiny_model, reqs, base)
    assert a[3] == (0.0, True)
    assert all(isinstance(ll, float) and isinstance(g, bool) for ll, g in a)
    packed = mc_loglikelihood(tiny_model, reqs, MCSettings(mask_token_id=mask_id, mc_num=6, seed=3, block_length=4,
                                                           max_rows=5))
    assert all(abs(x[0] - y[0]) < 1e-4 and x[1] == y[1] for x, y in zip(a, packed))
    other = mc_loglikelihood(tiny_model, reqs, MCSettings(mask_token_id=mask_id, mc_num=6, seed=4, block_length=4))
    assert other[0][0] != a[0][0]
