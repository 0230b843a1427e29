"""LLaDA2.1 editing (the 2.1 commit rule, both presets) on the shipped 3-digit toy: offloaded == resident."""

import pytest
import torch
from oled_hf.modeling import OledLLaDA2ForDiffusionLM
from transformers import AutoTokenizer

from oled_hf import OffloadConfig
from oled_hf.toy import TOY_CHECKPOINT
from oled_hf.toy.data import heldout_pairs, question_text


@pytest.fixture(scope="module")
def toy():
    tok = AutoTokenizer.from_pretrained(TOY_CHECKPOINT)
    tok.padding_side = "left"
    pairs = heldout_pairs(6)
    batch = tok.apply_chat_template([[{"role": "user", "content": question_text(a, b)}] for a, b in pairs],
                                    add_generation_prompt=True, return_tensors="pt", return_dict=True, padding=True)
    return OledLLaDA2ForDiffusionLM.from_pretrained(TOY_CHECKPOINT).eval(), batch


@pytest.mark.parametrize("kwargs", [
    dict(decoding="speed"),
    dict(decoding="quality"),
    dict(decoding="speed", steps=2, num_to_transfer=2),  # steps < block_length: the 2.1 rule sizes nothing
])
def test_offloaded_equals_resident_with_editing(toy, kwargs):
    resident, batch = toy
    kw = dict(return_dict_in_generate=True, **kwargs)
    want = resident.generate(**batch, **kw)
    assert int(want.edits.sum()) > 0  # both presets edit on the toy
    offloaded = OledLLaDA2ForDiffusionLM.from_pretrained(
        TOY_CHECKPOINT, offload_config=OffloadConfig(cache_ratio=0.3, cpu_compute="on")).eval()
    got = offloaded.generate(**batch, **kw)
    assert torch.equal(got.sequences, want.sequences)
    assert torch.equal(got.edits_per_block, want.edits_per_block)
    assert torch.equal(got.iterations, want.iterations)
