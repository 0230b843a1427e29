import json

import pytest
import torch
from oled_hf.modeling import OledLLaDA2ForDiffusionLM
from oled_hf.modeling.experts import RESIDENT_EXECUTOR
from safetensors import safe_open
from transformers import AutoModelForCausalLM

import oled_hf  # noqa: F401  (registers the Auto classes)
from oled_hf.toy import data, train_toy
from oled_hf.toy.tokenizer import build_toy_tokenizer
from oled_hf.toy.train import (
    LoopTrainingExecutor,
    diffusion_batch,
    set_executor,
    toy_config,
    trainable_parameters,
    training_executor,
    update_expert_bias,
)

# Every structural feature (dense layer 0, grouped routing, shared expert, QK-norm, partial RoPE), tiny.
MICRO = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
             rotary_dim=8, intermediate_size=64, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
             n_group=4, topk_group=2)
FAST = dict(batch_size=32, eval_n=0, log_every=0, eval_every=0, warmup=5, model_overrides=MICRO, minutes=None)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_toy_tokenizer(tmp_path_factory.mktemp("tok"))


def _state_equal(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_training_lowers_loss(tmp_path, tokenizer):
    report = train_toy(tmp_path, seed=0, steps=40, save=False, lr=1e-2, **FAST)
    assert report["steps"] == 40
    model = report["model"]
    assert all(b.experts_executor is RESIDENT_EXECUTOR for b in model.moe_blocks())
    assert all(p.requires_grad for p in model.parameters())  # end_training undid the bank training
    torch.manual_seed(0)  # the initial weights train_toy drew
    initial = OledLLaDA2ForDiffusionLM(toy_config(tokenizer, **MICRO))
    for name in ("model.layers.1.mlp.experts.5.down_proj.weight", "model.layers.1.mlp.experts.0.gate_proj.weight"):
        assert not torch.equal(model.state_dict()[name], initial.state_dict()[name]), name  # the experts trained
    assert report["loss_last_10"] < 0.6 * report["loss_first_10"]
    assert float(model.moe_blocks()[0].gate.expert_bias.abs().max()) > 0  # balancing ran


def test_same_seed_same_weights(tmp_path):
    a = train_toy(tmp_path / "a", seed=1, steps=6, save=False, **FAST)["model"]
    b = train_toy(tmp_path / "b", seed=1, steps=6, save=False, **FAST)["model"]
    c = train_toy(tmp_path / "c", seed=2, steps=6, save=False, **FAST)["model"]
    assert _state_equal(a, b)
    assert not _state_equal(a, c)


def test_diffusion_batch_masks_only_answers(tokenizer):
    enc = data.ToyEncoding.from_tokenizer(tokenizer)
    clean, noised, masked, t, p = diffusion_batch(enc, 256, 32, torch.Generator().manual_seed(0))
    assert torch.equal(noised[:, :p], clean[:, :p])
    assert torch.equal(noised[:, p:] == enc.mask, masked)
    assert bool((t > 0).all()) and bool((t <= 1).all())
    rate = masked.float().mean(dim=1)
    assert abs(float(rate.mean() - t.mean())) < 0.05


def test_training_executors_match_resident(tokenizer):
    torch.manual_seed(0)
    model = OledLLaDA2ForDiffusionLM(toy_config(tokenizer, **MICRO)).eval()
    with torch.no_grad():
        for block in model.moe_blocks():
            block.gate.weight.normal_(0, 0.5)
    enc = data.ToyEncoding.from_tokenizer(tokenizer)
    x = diffusion_batch(enc, 8, 32, torch.Generator().manual_seed(1))[1]
    outs = []
    for executor in (RESIDENT_EXECUTOR, LoopTrainingExecutor(), training_executor()):
        set_executor(model, executor)
        with torch.no_grad():
            outs.append(model(input_ids=x, block_length=8).logits)
    # The grouped resident kernel fuses gate and up into one GEMM (N = 2I); the loop runs two.
    # Both are fp32 matmuls of the same products, but the BLAS blocking (and so the summation
    # order) depends on N and on the CPU's ISA: equal on AVX2, a few ulps apart on AVX-512.
    # Bit-identity holds only where both sides run the same kernel (resident vs offloaded).
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=1e-5)
    torch.testing.assert_close(outs[0], outs[2], rtol=0, atol=1e-5)
    if training_executor() is RESIDENT_EXECUTOR:  # gradients agree too, per expert and through the banks
        set_executor(model, LoopTrainingExecutor())
        model.zero_grad()
        model(input_ids=x, block_length=8).logits.square().mean().backward()
        experts = model.moe_blocks()[0].experts
        loop_grads = [experts[e].up_proj.weight.grad.clone() for e in range(len(experts))]
        params = trainable_parameters(model, RESIDENT_EXECUTOR)
        set_executor(model, RESIDENT_EXECUTOR)
        assert len(params) == len(list(model.parameters())) - 3 * MICRO["num_experts"] + 2  # 2 banks, layer 1
        model(input_ids=x, block_length=8).logits.square().mean().backward()
        bank = model.moe_blocks()[0]._expert_bank
        inter = MICRO["moe_intermediate_size"]
        assert any(p is bank.gate_up for p in params) and not experts[0].up_proj.weight.requires_grad
        for e, grad in enumerate(loop_grads):
            torch.testing.assert_close(bank.gate_up.grad[e, inter:], grad, rtol=1e-5, atol=1e-7)
        with torch.no_grad():  # an optimiser step on the bank is a step on the per-expert (saved) weights
            bank.gate_up[3, inter:] += 1.0
        assert torch.equal(experts[3].up_proj.weight, bank.gate_up[3, inter:])


def test_bias_update_moves_toward_balance(tokenizer):
    model = OledLLaDA2ForDiffusionLM(toy_config(tokenizer, **MICRO))
    ids = torch.zeros(1, 10, 2, dtype=torch.long)  # every token picks experts 0 and 1
    ids[..., 1] = 1
    update_expert_bias(model, [(None, ids)], rate=0.01)
    bias = model.moe_blocks()[0].gate.expert_bias
    assert bias[0] == bias[1] == pytest.approx(-0.01)
    assert bool((bias[2:] == 0.01).all())


def test_saved_micro_checkpoint_layout(tmp_path):
    report = train_toy(tmp_path, seed=0, steps=2, save=True, **FAST)
    with safe_open(tmp_path / "model.safetensors", "pt") as f:  # the micro model fits one shard
        names = set(f.keys())
        assert f.get_tensor("model.layers.1.mlp.gate.expert_bias").dtype == torch.float32
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in names
    assert "model.layers.0.mlp.gate_proj.weight" in names and "lm_head.weight" in names
    gen = json.loads((tmp_path / "generation_config.json").read_text())
    tok = build_toy_tokenizer(tmp_path / "tok")
    assert gen["mask_token_id"] == tok.mask_token_id and gen["eos_token_id"] == tok.eos_token_id
    assert gen["block_length"] == 8 and gen["threshold"] == 0.9 and gen["do_sample"] is False
    assert json.loads((tmp_path / "toy_report.json").read_text())["steps"] == 2
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, OledLLaDA2ForDiffusionLM)
    assert _state_equal(loaded, report["model"])


def test_substitution_noise_corrupts_only_unmasked_answers(tokenizer):
    enc = data.ToyEncoding.from_tokenizer(tokenizer)
    plain = diffusion_batch(enc, 256, 32, torch.Generator().manual_seed(0))
    clean, noised, masked, t, p = diffusion_batch(enc, 256, 32, torch.Generator().manual_seed(0), substitution=0.5)
    assert torch.equal(clean, plain[0]) and torch.equal(masked, plain[2])  # same draws before the noise
    answer, target = noised[:, p:], clean[:, p:]
    swapped = (answer != target) & ~masked
    assert torch.equal(noised[:, :p], clean[:, :p]) and (answer[masked] == enc.mask).all()
    assert swapped.any() and torch.isin(answer[swapped], torch.tensor(enc.digits + (enc.eos,))).all()
    assert 0.25 < swapped.sum() / (~masked).sum() < 0.5  # 0.5 swaps, 1/11 of them drawing the same token


def test_toy_training_in_a_log_ends_with_its_duration(tmp_path, capsys):
    import re

    train_toy(tmp_path, seed=1, steps=3, save=False, **FAST)
    err = capsys.readouterr().err  # pytest's capture is a pipe, as a log is
    assert re.search(r"^training: done, 3/3 step in \d+\.\d s \(", err, re.M), err
