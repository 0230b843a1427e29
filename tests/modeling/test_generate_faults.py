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


def test_all_nan_expert_in_checkpoint_raises_naming_the_forward(tiny_path, tiny_model, copy_checkpoint):
    expert = _routed_expert(tiny_model, 0)
    layer = tiny_model.config.first_k_dense_replace  # first MoE layer
    key = f"model.layers.{layer}.mlp.experts.{expert}.down_proj.weight"
    weight = tiny_model.state_dict()[key]
    path = copy_checkpoint({key: torch.full_like(weight, float("nan"))})
    model = OledLLaDA2ForDiffusionLM.from_pretrained(path).eval()
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
