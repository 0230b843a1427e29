"""generate() on broken models: non-finite logits and stalled commits raise instead of looping."""

import pytest
import torch
from oled_hf.modeling import OledLLaDA2ForDiffusionLM
from oled_hf.modeling import generation_oled_llada2 as gen_mod

PROMPT = torch.tensor([[5, 17, 42, 99, 3, 250, 7, 64, 11, 300, 2, 8]])  # 12 tokens: ends mid-block of 8


def _routed_expert(model, layer: int) -> int:
    """An expert that the prompt actually routes in MoE ``layer`` (so NaN there reaches the logits)."""
    with torch.no_grad():
        out = model(PROMPT, block_length=8, output_router_logits=True)
    return int(out.router_logits[layer][1][0, 0, 0])  # (logits, top-k ids) per MoE layer


def test_all_nan_expert_raises_naming_the_forward(tiny_path):
    """An expert that turns NaN after loading (a checkpoint's NaN is refused at load) is caught at the
    first denoise forward that routes it."""
    model = OledLLaDA2ForDiffusionLM.from_pretrained(tiny_path).eval()
    expert = _routed_expert(model, 0)
    layer = model.config.first_k_dense_replace  # first MoE layer
    with torch.no_grad():
        model.model.layers[layer].mlp.experts[expert].down_proj.weight.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match=r"denoise forward of block 1, iteration 0 produced non-finite "
                                                  r"logits \(NaN or inf\) at 4 masked position\(s\) of batch row"):
        model.generate(PROMPT, max_new_tokens=16, block_length=8)


def test_nan_logits_mid_block_raise_and_the_model_recovers(tiny_model, monkeypatch):
    baseline = tiny_model.generate(PROMPT, max_new_tokens=16, block_length=8, threshold=1.0, steps=8)
    original, calls = tiny_model.forward, []

    def forward(*args, **kwargs):
        out = original(*args, **kwargs)
        calls.append(1)
        if len(calls) == 4:  # prefill, then denoise iterations 0, 1, 2 of block 1
            out.logits[0, -1, 7] = float("inf")
        return out

    monkeypatch.setattr(tiny_model, "forward", forward)
    with pytest.raises(FloatingPointError, match=r"block 1, iteration 2 .* at 1 masked position\(s\) of batch "
                                                  r"row\(s\) \[0\]"):
        tiny_model.generate(PROMPT, max_new_tokens=16, block_length=8, threshold=1.0, steps=8)
    monkeypatch.undo()
    assert torch.equal(tiny_model.generate(PROMPT, max_new_tokens=16, block_length=8, threshold=1.0, steps=8),
                       baseline)


def test_a_commit_rule_that_stalls_hits_the_iteration_cap(tiny_model, monkeypatch):
    forwards = []
    monkeypatch.setattr(gen_mod, "commit_official", lambda confidence, scheduled, threshold: confidence < -1)
    with pytest.raises(RuntimeError, match=r"block 1 still has 4 masked token\(s\) after 8 denoising iterations "
                                           r"\(the cap for block_length=8\)"):
        tiny_model.generate(PROMPT, max_new_tokens=16, block_length=8,
                            observers=[type("O", (), {"on_forward": lambda self, k, b, i: forwards.append(k)})()])
    assert forwards == ["prefill"] + ["denoise"] * 8


def _baseline(model):
    return model.generate(PROMPT, max_new_tokens=8, block_length=8)


MASK = 511  # tiny's mask_token_id; vocab_size 512
ONES = torch.ones_like(PROMPT)


@pytest.mark.parametrize("args, kwargs, message", [
    # a mask narrower than input_ids used to cut the prompt silently
    ((PROMPT,), dict(attention_mask=ONES[:, 2:]),
     r"attention_mask has shape \[1, 10\] but input_ids has \[1, 12\]: they must match"),
    ((PROMPT,), dict(attention_mask=ONES * 2), r"attention_mask must hold only 0 \(padding\) and 1 .*found \[2.0\]"),
    ((PROMPT,), dict(attention_mask=ONES[0]), r"attention_mask has shape \[12\] but input_ids"),
    ((PROMPT.repeat(2, 1),), dict(attention_mask=ONES),
     r"attention_mask has shape \[1, 12\] but input_ids has \[2, 12\]"),
    ((torch.cat([PROMPT[:, :9], torch.tensor([[MASK]]), PROMPT[:, 10:]], 1),), {},
     r"input_ids row 0 contains mask_token_id=511 at prompt position\(s\) \[9\]"),
    ((torch.zeros(1, 0, dtype=torch.long),), {}, r"input_ids has 0 tokens per row \(shape \[1, 0\]\)"),
    ((torch.zeros(0, 5, dtype=torch.long),), {}, r"input_ids has an empty batch"),
    ((PROMPT.float(),), {}, r"input_ids must be an integer tensor .*; got dtype torch.float32"),
    ((PROMPT.tolist(),), {}, r"input_ids must be a torch.Tensor of token ids; got list"),
    ((PROMPT,), dict(max_new_tokens=True), r"max_new_tokens=True is invalid: must be a positive integer"),
    ((PROMPT,), dict(block_length=True), r"block_length=True is invalid"),
    ((PROMPT + 600,), {}, r"input_ids row 0 holds token id\(s\) \[602, 603, 605, .*outside the vocabulary "
                          r"\(allowed: 0 to 511, vocab_size=512\)"),
    ((PROMPT - 10,), {}, r"input_ids row 0 holds token id\(s\) \[-8, -7, -5, -3, -2\] outside the vocabulary"),
])
def test_bad_inputs_raise_naming_the_argument_and_change_nothing(tiny_model, args, kwargs, message):
    baseline = _baseline(tiny_model)
    forwards = []
    observer = type("O", (), {"on_forward": lambda self, k, b, i: forwards.append(k)})()
    with pytest.raises(ValueError, match=message):
        tiny_model.generate(*args, observers=[observer], **{"max_new_tokens": 8, "block_length": 8, **kwargs})
    assert forwards == []  # refused before any forward
    assert torch.equal(_baseline(tiny_model), baseline)


def test_one_dimensional_prompt_and_mask_are_one_row(tiny_model):
    out = tiny_model.generate(PROMPT[0], attention_mask=ONES[0], max_new_tokens=8, block_length=8)
    assert torch.equal(out, _baseline(tiny_model))
    assert out.dtype == torch.long
