"""Caller-built 4-D attention masks (issue 35.6): the official additive form, bool masks, and refusals."""

import pytest
import torch
from oled_hf.modeling import OledLLaDA2ForDiffusionLM
from oled_hf.modeling.attention_mask import build_attention_mask

B = 8  # block_length of the comparisons


def official_block_mask(total: int, block_length: int, dtype: torch.dtype) -> torch.Tensor:
    """The official block-diffusion mask as its sampler builds it (shared/docs/llada2.md §4.2, §7.3): a 0/1
    block-causal matrix over the blocks, expanded to tokens, ``.log()`` (0 = attend, -inf = blocked), cast to
    the model dtype, shaped [1, 1, T, T]."""
    num_blocks = total // block_length
    block_mask = torch.tril(torch.ones(num_blocks, num_blocks))
    full = block_mask.repeat_interleave(block_length, dim=0).repeat_interleave(block_length, dim=1)
    return full.unsqueeze(0).unsqueeze(0).log().to(dtype)


def _ids(model, length: int = 3 * B) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, model.config.vocab_size - 8, (1, length), generator=g)


@pytest.fixture(scope="module")
def eager_model(tiny_path):
    return OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path, attn_implementation="eager").eval()


@pytest.mark.parametrize("which", ["sdpa", "eager"])
def test_official_additive_mask_equals_block_length(tiny_model, eager_model, which):
    model = tiny_model if which == "sdpa" else eager_model
    ids = _ids(model)
    mask = official_block_mask(ids.shape[1], B, model.dtype)
    assert mask.dtype == model.dtype and bool(torch.isneginf(mask).any()) and bool((mask == 0).any())
    with torch.no_grad():
        ours = model(ids, block_length=B).logits
        official = model(ids, attention_mask=mask).logits
    # read backwards (the old `.to(torch.bool)` cast), this differed by ~1.2 on the tiny model
    assert (ours - official).abs().max().item() <= 1e-5


def test_official_mask_in_bf16_against_an_fp32_model(tiny_model):
    """The official generate casts its mask to bf16 whatever the model's dtype: accepted and cast here."""
    ids = _ids(tiny_model)
    mask = official_block_mask(ids.shape[1], B, torch.bfloat16)
    with torch.no_grad():
        diff = (tiny_model(ids, block_length=B).logits - tiny_model(ids, attention_mask=mask).logits).abs().max()
    assert diff.item() <= 1e-5


def test_bool_mask_true_attends(tiny_model):
    ids = _ids(tiny_model)
    keep = official_block_mask(ids.shape[1], B, torch.float32) == 0
    with torch.no_grad():
        diff = (tiny_model(ids, block_length=B).logits - tiny_model(ids, attention_mask=keep).logits).abs().max()
    assert diff.item() == 0.0


def test_additive_mask_is_added_as_the_official_forward_adds_it(tiny_model):
    """A soft bias (not only 0 / -inf) changes the logits; blocking every later block equals block_length."""
    ids = _ids(tiny_model)
    mask = official_block_mask(ids.shape[1], B, torch.float32)
    soft = mask.clone()
    soft[soft == 0] = -0.5 * torch.rand(int((soft == 0).sum()), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = tiny_model(ids, attention_mask=mask).logits
        biased = tiny_model(ids, attention_mask=soft).logits
    assert (plain - biased).abs().max().item() > 1e-4


def test_zero_one_float_mask_is_refused(tiny_model):
    ids = _ids(tiny_model)
    keep01 = (official_block_mask(ids.shape[1], B, torch.float32) == 0).float()
    with pytest.raises(ValueError, match=r"4-D float mask with values above 0 .*additive.*bool mask") as err:
        tiny_model(ids, attention_mask=keep01)
    assert "max 1.0" in str(err.value)


def test_nan_and_integer_masks_are_refused():
    nan = torch.zeros(1, 1, 4, 4)
    nan[0, 0, 1, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        build_attention_mask(nan, None, 1, 0, 4, 4, torch.device("cpu"))
    with pytest.raises(ValueError, match="must be bool .* or additive float"):
        build_attention_mask(torch.ones(1, 1, 4, 4, dtype=torch.long), None, 1, 0, 4, 4, torch.device("cpu"))


def test_four_d_mask_shape_and_block_length_are_checked(tiny_model):
    ids = _ids(tiny_model)
    mask = official_block_mask(ids.shape[1], B, torch.float32)
    with pytest.raises(ValueError, match=r"block_length=8 cannot be combined with a 4-D attention_mask"):
        tiny_model(ids, attention_mask=mask, block_length=B)
    with pytest.raises(ValueError, match=r"a 4-D mask must be \(batch, 1 or heads, queries, keys\)"):
        tiny_model(ids[:, :-1], attention_mask=mask)
    with pytest.raises(ValueError, match="attention_mask has 3 dimensions"):
        tiny_model(ids, attention_mask=mask[0])


def test_padded_two_d_mask_stays_bidirectional(tiny_model):
    """A documented deliberate difference: an all-ones 2-D mask is full attention, not causal."""
    ids = _ids(tiny_model)
    with torch.no_grad():
        none = tiny_model(ids).logits
        ones = tiny_model(ids, attention_mask=torch.ones_like(ids)).logits
        causal = tiny_model(ids, attention_mask=torch.ones(ids.shape[1], ids.shape[1]).tril().bool()[None, None]).logits
    assert (none - ones).abs().max().item() == 0.0
    assert (none - causal).abs().max().item() > 1e-3
