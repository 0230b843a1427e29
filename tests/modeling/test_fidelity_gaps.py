"""Issue 35.7: ``use_qk_norm`` honoured as the official code does, greedy ties resolved as ``argmax(logits)``."""

import pytest
import torch
from oled_hf.modeling import OledLLaDA2Config, OledLLaDA2ForDiffusionLM
from oled_hf.modeling.commit import choose_tokens
from torch import nn

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, rotary_dim=8, num_experts=8, num_experts_per_tok=2,
            moe_intermediate_size=8, n_group=2, topk_group=1, mask_token_id=63, eos_token_id=62, pad_token_id=62)


def _model(**overrides) -> OledLLaDA2ForDiffusionLM:
    torch.manual_seed(0)
    return OledLLaDA2ForDiffusionLM(OledLLaDA2Config(**TINY, **overrides)).eval()


def test_use_qk_norm_false_applies_no_qk_norm():
    with_norm, without = _model(), _model(use_qk_norm=False)
    names = set(without.state_dict())
    assert not any("query_layernorm" in n or "key_layernorm" in n for n in names)  # as the official modules
    without.load_state_dict({k: v for k, v in with_norm.state_dict().items() if k in names})
    for layer in with_norm.model.layers:  # the same model with QK-norm taken out by hand
        layer.attention.query_layernorm = nn.Identity()
        layer.attention.key_layernorm = nn.Identity()
    ids = torch.randint(0, 60, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(without(ids, block_length=4).logits, with_norm(ids, block_length=4).logits)


def test_use_qk_norm_true_still_normalises():
    model = _model()
    assert isinstance(model.model.layers[0].attention.query_layernorm, nn.Module)
    assert "model.layers.0.attention.key_layernorm.weight" in model.state_dict()


def test_use_qk_norm_must_be_a_bool():
    with pytest.raises(ValueError, match="use_qk_norm='no' is invalid: must be true or false"):
        OledLLaDA2Config(**TINY, use_qk_norm="no")


def test_greedy_tie_rule_is_argmax_of_logits():
    """Two logits one ulp apart round to the same fp32 probability: ``argmax(logits)`` (dInfer's rule) takes the
    larger logit; ``argmax(softmax(logits))`` takes the lower id. The project keeps the first, a deliberate
    difference from decoders that take the second (docs/model.md says so: issue 67 item 11)."""
    low = torch.tensor(1e-3)
    high = torch.nextafter(low, torch.tensor(1.0))
    logits = torch.full((1, 1, 6), -5.0)
    logits[0, 0, 1], logits[0, 0, 2] = low, high
    probs = logits.softmax(-1)
    assert probs[0, 0, 1] == probs[0, 0, 2]  # a tie in probability, not in logits
    ids, p = choose_tokens(logits, mask_token_id=5)
    assert ids.item() == 2 == logits[0, 0, :5].argmax().item() != probs[0, 0, :5].argmax().item()
    assert p.item() == pytest.approx(probs[0, 0, 2].item())


def test_greedy_exact_logit_ties_take_the_lowest_id_and_never_the_mask():
    logits = torch.zeros(1, 2, 6)
    logits[0, 0, [3, 4]] = 2.0
    logits[0, 1, [0, 5]] = 7.0  # 5 is the mask id
    ids, _ = choose_tokens(logits, mask_token_id=5)
    assert ids.tolist() == [[3, 0]]
