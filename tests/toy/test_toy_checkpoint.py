"""The shipped checkpoint: official layout, loads through the Auto classes, and does the task."""

import json

import pytest
import torch
from oled_hf.modeling import OledLLaDA2ForDiffusionLM
from transformers import AutoModelForCausalLM, AutoTokenizer

import oled_hf  # noqa: F401  (registers the Auto classes)
from oled_hf.toy import TOY_CHECKPOINT
from oled_hf.toy.data import ToyEncoding, answer_text, heldout_pairs
from oled_hf.toy.evaluate import block_diffusion_decode, decode_text, evaluate_checkpoint

N = 40


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(TOY_CHECKPOINT).eval()


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TOY_CHECKPOINT)


def test_checkpoint_files_and_size():
    files = {p.name for p in TOY_CHECKPOINT.iterdir()}
    for name in ("config.json", "generation_config.json", "model.safetensors.index.json", "tokenizer.json",
                 "tokenizer_config.json", "configuration_oled_llada2.py", "modeling_oled_llada2.py"):
        assert name in files
    total = sum(p.stat().st_size for p in TOY_CHECKPOINT.iterdir())
    assert total < 20 * 2**20
    config = json.loads((TOY_CHECKPOINT / "config.json").read_text())
    assert config["num_experts"] == 64 and config["first_k_dense_replace"] == 1 and config["n_group"] == 8
    gen = json.loads((TOY_CHECKPOINT / "generation_config.json").read_text())
    assert gen["threshold"] == 0.9 and gen["mask_token_id"] == config["mask_token_id"]
    assert gen["eos_token_id"] == gen["pad_token_id"] == config["eos_token_id"]


def test_loads_with_auto_class(model, tokenizer):
    assert isinstance(model, OledLLaDA2ForDiffusionLM)
    assert model.config.mask_token_id == tokenizer.mask_token_id
    assert model.moe_blocks()[0].gate.expert_bias.dtype == torch.float32
    assert float(model.moe_blocks()[0].gate.expert_bias.abs().max()) > 0  # the balancing bias was trained


def test_answers_heldout_problems(model, tokenizer):
    report = evaluate_checkpoint(model, tokenizer, n=N, block_length=8, threshold=0.9, max_new_tokens=8)
    assert report["exact_match"] >= 0.9
    assert report["tokens_per_iteration"] > 1.0


def test_decoder_with_block_16_and_single_prompt(model, tokenizer):
    enc = ToyEncoding.from_tokenizer(tokenizer)
    a, b = heldout_pairs(1)[0]
    question = f"What is {a}+{b}?"
    ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    res = block_diffusion_decode(model, torch.tensor([ids]), block_length=16, max_new_tokens=8, threshold=0.9,
                                 mask_id=enc.mask, eos_id=enc.eos)
    assert decode_text(tokenizer, res.tokens[0], enc.eos) == answer_text(a, b)
    assert int(res.committed[0]) == 7  # one block: 4 digits or fewer, EOS and EOS padding


def test_generate_matches_task(model, tokenizer):
    """The team's ``model.generate`` (generation_config defaults: block 8, threshold 0.9) solves the task too."""
    from oled_hf.modeling.generation_oled_llada2 import DiffusionGenerationMixin

    if "generate" not in DiffusionGenerationMixin.__dict__:
        pytest.skip("block-diffusion generate is not available yet")
    enc = ToyEncoding.from_tokenizer(tokenizer)
    pairs = heldout_pairs(N)
    prompts = enc.prompts(torch.tensor([x for x, _ in pairs]), torch.tensor([y for _, y in pairs]))
    out = model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), block_length=8,
                         threshold=0.9, max_new_tokens=8, return_dict_in_generate=True)
    new = out.sequences[:, prompts.shape[1]:]
    correct = sum(decode_text(tokenizer, new[i], enc.eos) == answer_text(x, y) for i, (x, y) in enumerate(pairs))
    assert correct >= 0.9 * N
