import torch
from oled_hf.modeling.configuration_oled_llada2 import OledLLaDA2Config
from oled_hf.modeling.modeling_oled_llada2 import route_tokens

CFG = OledLLaDA2Config(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                       num_key_value_heads=1, head_dim=8, rotary_dim=4, num_experts=16, num_experts_per_tok=4,
                       n_group=4, topk_group=2, mask_token_id=63)


def _inputs(seed=0, t=12):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t, 16, generator=g), torch.randn(16, 16, generator=g)


def test_weights_sum_to_scaling_factor_and_come_from_unbiased_scores():
    x, w = _inputs()
    bias = torch.randn(16) * 0.5
    logits, ids, weights = route_tokens(x, w, bias, CFG)
    torch.testing.assert_close(weights.sum(-1), torch.full((12,), 2.5))
    scores = torch.sigmoid(x @ w.T)
    expected = scores.gather(1, ids)
    expected = expected / expected.sum(-1, keepdim=True) * 2.5
    torch.testing.assert_close(weights, expected)
    assert weights.dtype == torch.float32 and logits.dtype == torch.float32


def test_bias_changes_selection_not_weighting():
    x, w = _inputs(1)
    _, ids0, _ = route_tokens(x, w, torch.zeros(16), CFG)
    bias = torch.zeros(16)
    bias[5] = 10.0  # expert 5 (group 1) now wins every selection
    _, ids1, w1 = route_tokens(x, w, bias, CFG)
    assert (ids1 == 5).any(-1).all()
    assert not torch.equal(ids0, ids1)
    scores = torch.sigmoid(x @ w.T)
    sel = scores.gather(1, ids1)
    torch.testing.assert_close(w1, sel / sel.sum(-1, keepdim=True) * 2.5)


def test_group_limited_selection():
    x, w = _inputs(2, t=64)
    bias = torch.randn(16)
    _, ids, _ = route_tokens(x, w, bias, CFG)
    groups = ids // 4  # 4 experts per group
    for row in groups:
        assert len(set(row.tolist())) <= CFG.topk_group
    # The kept groups are the two with the largest top-2 sums of biased scores.
    s = torch.sigmoid(x @ w.T) + bias
    group_score = s.view(64, 4, 4).topk(2, -1).values.sum(-1)
    best = group_score.topk(2, -1).indices.sort(-1).values
    for row, allowed in zip(groups, best):
        assert set(row.tolist()) <= set(allowed.tolist())


def test_disabled_bias_is_ignored():
    x, w = _inputs(3)
    cfg = OledLLaDA2Config(**{**CFG.to_diff_dict(), "moe_router_enable_expert_bias": False})
    from oled_hf.modeling.modeling_oled_llada2 import OledLLaDA2Gate

    gate = OledLLaDA2Gate(cfg)
    gate.weight.data.copy_(w)
    gate.expert_bias.fill_(100.0)
    _, ids, _ = gate(x)
    _, ids_ref, _ = route_tokens(x, w, None, cfg)
    assert torch.equal(ids, ids_ref)
