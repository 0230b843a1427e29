"""The shipped long-answer checkpoint: mini's routing shape, official layout, its recorded figures, lossless offload."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import oled_hf
from oled_hf.toy.long import LONG_CHECKPOINT, REPORT_NAME, load_mix
from oled_hf.toy.long.data import LongEncoding
from oled_hf.toy.long.evaluate import decode, left_pad
from oled_hf.toy.long.tasks import heldout_problems
from tests.systems import system_for

pytestmark = pytest.mark.skipif(not (LONG_CHECKPOINT / "config.json").is_file(), reason="long checkpoint not built")


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(LONG_CHECKPOINT).eval()


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(LONG_CHECKPOINT)


@pytest.fixture(scope="module")
def report():
    return json.loads((LONG_CHECKPOINT / REPORT_NAME).read_text())


def test_routing_shape_layout_and_size():
    config = json.loads((LONG_CHECKPOINT / "config.json").read_text())
    assert (config["num_experts"], config["num_experts_per_tok"], config["n_group"], config["topk_group"]) == \
        (256, 8, 8, 4)
    assert config["num_shared_experts"] == 1 and config["first_k_dense_replace"] == 1
    assert config["num_hidden_layers"] - config["first_k_dense_replace"] >= 3
    assert config["use_qk_norm"] and config["partial_rotary_factor"] < 1
    gen = json.loads((LONG_CHECKPOINT / "generation_config.json").read_text())
    assert gen["block_length"] == 16 and gen["threshold"] == 0.95 and gen["mask_token_id"] == config["mask_token_id"]
    files = {p.name for p in LONG_CHECKPOINT.iterdir()}
    assert {"model.safetensors.index.json", "tokenizer.json", "chat_template.jinja", REPORT_NAME} <= files
    assert sum(p.stat().st_size for p in LONG_CHECKPOINT.iterdir()) < 64 * 2**20


def test_loads_and_balancing_bias_was_trained(model, tokenizer):
    assert model.config.mask_token_id == tokenizer.mask_token_id
    assert all(float(b.gate.expert_bias.abs().max()) > 0 for b in model.moe_blocks())


def test_reproduces_its_recorded_answers_and_figures(model, tokenizer, report):
    """The report's held-out examples (block 16, threshold 0.95) come out again, answer for answer."""
    result = report["heldout"]["results"][0]
    assert (result["block_length"], result["threshold"]) == (16, 0.95)
    enc = LongEncoding.from_tokenizer(tokenizer)
    by_question = {e["question"]: e for e in result["examples"]}
    problems = [p for spec in load_mix() for p in heldout_problems(spec, 2) if p.question in by_question]
    assert len(problems) >= 4
    texts, fig = decode(model, enc, problems, block_length=16, threshold=0.95)
    assert texts == [by_question[p.question]["got"] for p in problems]
    assert fig.iterations / fig.blocks >= 3  # inter-iteration retention has work to do
    assert fig.blocks / fig.n >= 2  # answers span several blocks
    overall = result["overall"]
    assert overall["iterations_per_block"] >= 3 and overall["blocks_per_answer"] >= 2


@pytest.mark.parametrize("policy,ratio", [("oled", 0.1), ("lru", 0.4)])
def test_offloaded_answers_equal_resident(model, tokenizer, policy, ratio):
    enc = LongEncoding.from_tokenizer(tokenizer)
    questions = [heldout_problems(spec, 1)[0].question for spec in load_mix()]
    ids, mask = left_pad(enc.prompt_ids(questions), enc.eos)
    kwargs = dict(attention_mask=mask, max_new_tokens=48)
    resident = model.generate(ids, **kwargs)
    offloaded_model = AutoModelForCausalLM.from_pretrained(
        LONG_CHECKPOINT, offload_config=oled_hf.OffloadConfig(cache_ratio=ratio, system=system_for(policy))).eval()
    offloaded = offloaded_model.generate(ids, **kwargs)
    assert torch.equal(resident, offloaded)
    stats = offloaded_model.offload_stats()["total"]
    assert 0.0 < stats["hit_rate"] < 1.0
