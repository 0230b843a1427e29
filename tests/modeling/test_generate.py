import threading

import pytest
import torch
from oled_hf.modeling.events import IterationObserver
from transformers import TextIteratorStreamer, TextStreamer


def _chat(tok, text):
    return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                   return_tensors="pt", return_dict=True)


class Recorder(IterationObserver):
    def __init__(self):
        self.events, self.blocks, self.forwards = [], [], []

    def on_block_start(self, block_index, token_ids):
        self.blocks.append(("start", block_index))

    def on_iteration(self, event):
        self.events.append(event)

    def on_block_end(self, block_index, token_ids):
        self.blocks.append(("end", block_index))

    def on_forward(self, kind, block_index, iteration):
        self.forwards.append(kind)


def test_cached_equals_uncached(tiny_model, tiny_tokenizer):
    inputs = _chat(tiny_tokenizer, "what is the weather")  # 53 tokens: ends mid-block for B=8 and 16
    for block_length in (8, 16):
        a = tiny_model.generate(**inputs, max_new_tokens=40, block_length=block_length, threshold=0.9,
                                return_dict_in_generate=True)
        b = tiny_model.generate(**inputs, max_new_tokens=40, block_length=block_length, threshold=0.9,
                                use_cache=False, return_dict_in_generate=True)
        assert torch.equal(a.sequences, b.sequences)
        assert torch.equal(a.iterations, b.iterations)
        assert a.forwards > b.forwards  # prefill + refreshes are the cached decoder's extra forwards


def test_returns_prompt_plus_new_tokens_without_masks(tiny_model, tiny_tokenizer):
    inputs = _chat(tiny_tokenizer, "hi")
    out = tiny_model.generate(**inputs, max_new_tokens=20, block_length=8)
    assert out.shape == (1, inputs["input_ids"].shape[1] + 20)
    assert torch.equal(out[:, : inputs["input_ids"].shape[1]], inputs["input_ids"])
    assert not (out == tiny_model.config.mask_token_id).any()


def test_threshold_one_commits_exactly_the_schedule(tiny_model, tiny_tokenizer):
    rec = Recorder()
    inputs = {"input_ids": torch.arange(5, 21).unsqueeze(0)}  # 16 tokens: whole blocks
    tiny_model.generate(**inputs, max_new_tokens=16, block_length=8, steps=4, threshold=1.0, observers=[rec])
    per_iter = [int(e.committed.sum()) for e in rec.events]
    assert per_iter == [2, 2, 2, 2, 2, 2, 2, 2]  # 8 masks over 4 steps, two blocks


def test_threshold_zero_commits_block_in_one_iteration(tiny_model, tiny_tokenizer):
    out = tiny_model.generate(**_chat(tiny_tokenizer, "hi"), max_new_tokens=32, block_length=16, threshold=0.0,
                              return_dict_in_generate=True)
    assert out.iterations.tolist() == out.blocks.tolist()


def test_events_and_forward_kinds(tiny_model, tiny_tokenizer):
    rec = Recorder()
    tiny_model.add_iteration_observer(rec)
    try:
        out = tiny_model.generate(**_chat(tiny_tokenizer, "hello"), max_new_tokens=16, block_length=8,
                                  return_dict_in_generate=True)
    finally:
        tiny_model.remove_iteration_observer(rec)
    assert rec.forwards[0] == "prefill" and rec.forwards.count("denoise") == len(rec.events)
    assert rec.blocks[0][0] == "start" and rec.blocks[-1][0] == "end"
    first = rec.events[0]
    assert first.iteration == 0 and first.masked.shape == first.confidence.shape == (1, 8)
    assert (first.confidence[~first.masked] == 1.0).all()
    assert torch.equal(first.committed & ~first.masked, torch.zeros_like(first.committed))
    assert sum(int(e.committed.sum()) for e in rec.events) >= 16
    assert len(rec.events) == int(out.iterations[0])


def _force_token_at(model, token_id, positions):
    """Wrap forward so that ``token_id`` wins with certainty at the given absolute positions."""
    original = model.forward

    def forward(*args, position_ids=None, logits_to_keep=0, **kwargs):
        out = original(*args, position_ids=position_ids, logits_to_keep=logits_to_keep, **kwargs)
        pos = position_ids[:, -out.logits.shape[1]:]
        hit = torch.isin(pos, torch.tensor(positions))
        out.logits[hit] = -1e4
        out.logits[..., token_id][hit] = 1e4
        return out

    return forward


def test_eos_stop_and_truncation(tiny_model, tiny_tokenizer, monkeypatch):
    inputs = _chat(tiny_tokenizer, "hi")
    eos = tiny_model.config.eos_token_id
    prompt = inputs["input_ids"].shape[1]
    monkeypatch.setattr(tiny_model, "forward", _force_token_at(tiny_model, eos, [prompt + 5, prompt + 9]))
    out = tiny_model.generate(**inputs, max_new_tokens=64, block_length=8, return_dict_in_generate=True)
    new = out.sequences[0, prompt:]
    assert new.tolist().count(eos) == 1 and len(new) == 6 and new[-1].item() == eos  # cut after the first EOS
    # decoding stopped after the block holding the EOS
    assert int(out.blocks[0]) == (prompt + 5) // 8 - prompt // 8 + 1
    early = tiny_model.generate(**inputs, max_new_tokens=64, block_length=8, eos_early_stop=True, threshold=1.0,
                                steps=8, return_dict_in_generate=True)
    assert early.sequences.shape[1] == prompt + 6


def test_batch_rows_padded_after_eos(tiny_model, tiny_tokenizer, monkeypatch):
    tiny_tokenizer.padding_side = "left"
    texts = ["hi", "a longer question about many things"]
    batch = tiny_tokenizer.apply_chat_template([[{"role": "user", "content": t}] for t in texts],
                                               add_generation_prompt=True, return_tensors="pt", return_dict=True,
                                               padding=True)
    short = _chat(tiny_tokenizer, "hi")["input_ids"].shape[1]
    monkeypatch.setattr(tiny_model, "forward", _force_token_at(tiny_model, 509, [short + 2]))
    out = tiny_model.generate(**batch, max_new_tokens=16, block_length=8)
    width = batch["input_ids"].shape[1]
    assert out[0, width:width + 3].tolist()[-1] == 509 and (out[0, width + 3:] == 509).all()  # pad id = eos id
    assert out.shape[1] == width + 16


def test_batch_equals_single(tiny_model, tiny_tokenizer):
    texts = ["hi", "tell me a long story about the sea and ships", "what is 2+2"]
    tiny_tokenizer.padding_side = "left"
    batch = tiny_tokenizer.apply_chat_template([[{"role": "user", "content": t}] for t in texts],
                                               add_generation_prompt=True, return_tensors="pt", return_dict=True,
                                               padding=True)
    out = tiny_model.generate(**batch, max_new_tokens=24, block_length=8, threshold=0.9)
    width = batch["input_ids"].shape[1]
    for i, t in enumerate(texts):
        single = tiny_model.generate(**_chat(tiny_tokenizer, t), max_new_tokens=24, block_length=8, threshold=0.9)
        n = single.shape[1] - _chat(tiny_tokenizer, t)["input_ids"].shape[1]
        assert out[i, width : width + n].tolist() == single[0, -n:].tolist()


def test_text_streamer_and_iterator_get_blocks_in_order(tiny_model, tiny_tokenizer, capsys):
    inputs = _chat(tiny_tokenizer, "stream please")
    final = tiny_model.generate(**inputs, max_new_tokens=24, block_length=8)
    text = tiny_tokenizer.decode(final[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)

    class Counting(TextIteratorStreamer):
        puts = 0

        def put(self, value):
            Counting.puts += 1
            super().put(value)

    streamer = Counting(tiny_tokenizer, skip_prompt=True, skip_special_tokens=True)
    thread = threading.Thread(target=tiny_model.generate, kwargs=dict(**inputs, max_new_tokens=24, block_length=8,
                                                                       streamer=streamer))
    thread.start()
    chunks = list(streamer)
    thread.join()
    assert "".join(chunks) == text
    assert Counting.puts == 1 + 24 // 8 + 1  # prompt, then one put per block (prompt tail block included)
    tiny_model.generate(**inputs, max_new_tokens=24, block_length=8,
                        streamer=TextStreamer(tiny_tokenizer, skip_prompt=True, skip_special_tokens=True))
    assert capsys.readouterr().out.strip() == text.strip()


def test_greedy_deterministic_and_sampling_seeded(tiny_model, tiny_tokenizer):
    inputs = _chat(tiny_tokenizer, "hi")
    assert torch.equal(tiny_model.generate(**inputs, max_new_tokens=16, block_length=8),
                       tiny_model.generate(**inputs, max_new_tokens=16, block_length=8))
    torch.manual_seed(3)
    a = tiny_model.generate(**inputs, max_new_tokens=16, block_length=8, do_sample=True, temperature=1.0)
    torch.manual_seed(3)
    b = tiny_model.generate(**inputs, max_new_tokens=16, block_length=8, do_sample=True, temperature=1.0)
    assert torch.equal(a, b)


def test_all_mask_argmax_still_progresses(tiny_model, tiny_tokenizer):
    import copy

    model = copy.deepcopy(tiny_model)
    with torch.no_grad():
        model.lm_head.weight[model.config.mask_token_id] = model.model.norm.weight.sign() * 10.0
    out = model.generate(**_chat(tiny_tokenizer, "hi"), max_new_tokens=16, block_length=8, threshold=0.99,
                         return_dict_in_generate=True)
    assert not (out.sequences == model.config.mask_token_id).any()
    assert out.iterations[0] <= 16 + 8


@pytest.mark.parametrize("kwargs, message", [
    (dict(block_length=0), "block_length=0"),
    (dict(threshold=1.5), "threshold=1.5"),
    (dict(threshold=-0.1), "threshold=-0.1"),
    (dict(max_new_tokens=0), "max_new_tokens=0"),
    (dict(steps=0), "steps=0"),
    (dict(num_beams=2), "num_beams=2"),
    (dict(max_new_tokens=5000), "max_position_embeddings=4096"),
])
def test_bad_arguments_raise(tiny_model, kwargs, message):
    with pytest.raises(ValueError, match=message):
        tiny_model.generate(torch.tensor([[1, 2, 3]]), **kwargs)


def test_prompt_longer_than_context_raises(tiny_model):
    with pytest.raises(ValueError, match="longer than max_position_embeddings"):
        tiny_model.generate(torch.ones(1, 4097, dtype=torch.long), max_new_tokens=1)


def test_gen_length_alias_and_generation_config_defaults(tiny_model):
    assert tiny_model.generation_config.block_length == 32 and tiny_model.generation_config.mask_token_id == 511
    out = tiny_model.generate(torch.tensor([[1, 2, 3]]), gen_length=10, block_length=8)
    assert out.shape == (1, 13)
