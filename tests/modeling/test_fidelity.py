"""generate() against the official decoders' rules (fixture ``official_generate``) and loader dtype."""

import pytest
import torch


def _chat(tok, text):
    return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                   return_tensors="pt", return_dict=True)["input_ids"]


@pytest.mark.parametrize("block_length, steps, threshold", [(8, 4, 0.9), (16, 4, 0.5)])
def test_tokens_match_official_rules(tiny_model, tiny_tokenizer, official_generate, block_length, steps, threshold):
    cfg = tiny_model.config
    for text in ("hi", "what is the weather"):  # 49 and 53 tokens: the first block holds the prompt's tail
        ids = _chat(tiny_tokenizer, text)
        want, forwards = official_generate(tiny_model, ids[0], gen_length=24, block_length=block_length, steps=steps,
                                           threshold=threshold, mask_id=cfg.mask_token_id, eos_id=cfg.eos_token_id)
        for use_cache in (True, False):
            out = tiny_model.generate(ids, max_new_tokens=24, block_length=block_length, steps=steps,
                                      threshold=threshold, use_cache=use_cache, return_dict_in_generate=True)
            assert out.sequences[0, ids.shape[1]:].tolist() == want
            assert int(out.iterations[0]) == forwards


class _Commits:
    def __init__(self):
        self.counts = []

    def on_iteration(self, event):
        self.counts.append(int(event.committed.sum()))


def test_schedule_sized_by_block_length_in_partial_first_block(tiny_model):
    """5 prompt tokens in a block of 8, steps=4, nothing above threshold: the official schedule is
    8 tokens over 4 steps (2 each), so the 3 masks go 2 + 1; sizing by the masked count would give 1 + 1 + 1."""
    rec = _Commits()
    tiny_model.generate(torch.arange(5, 10).unsqueeze(0), max_new_tokens=11, block_length=8, steps=4, threshold=1.0,
                        observers=[rec])
    assert rec.counts == [2, 1, 2, 2, 2, 2]
