"""LLaDA2.1 token editing in generate(): the rule, its presets, and its invariants."""

import threading

import pytest
import torch
from oled_hf.modeling.commit import edit_positions
from oled_hf.modeling.params import DECODING_PRESETS
from transformers import GenerationConfig, TextIteratorStreamer

# editing_threshold=0 edits wherever the argmax moved: on the random tiny model (p(argmax) ~ 1/500)
# that is the only setting under which edits fire on their own, many per block.
EDIT_ALWAYS = dict(editing_threshold=0.0, max_post_steps=3)


def _chat(tok, text):
    return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                   return_tensors="pt", return_dict=True)


class _Events:
    def __init__(self):
        self.events = []

    def on_iteration(self, event):
        self.events.append(event)


def test_edit_positions_is_strict_and_needs_a_different_token():
    ids = torch.tensor([[5, 6, 7, 8]])
    tokens = torch.tensor([[5, 9, 9, 9]])
    prob = torch.tensor([[0.9, 0.5, 0.6, 0.9]])
    editable = torch.tensor([[True, True, True, False]])
    assert edit_positions(ids, prob, tokens, editable, 0.5).tolist() == [[False, False, True, False]]


def _rig(model, position, first, better, q):
    """Forward wrapper: at absolute ``position`` a mask becomes ``first`` with certainty; once decoded as
    ``first`` the model prefers ``better`` with probability ``q`` (else ``first``); ``better`` then stays."""
    original = model.forward

    def forward(input_ids=None, *args, position_ids=None, **kwargs):
        out = original(input_ids, *args, position_ids=position_ids, **kwargs)
        n = out.logits.shape[1]
        pos, tok = position_ids[:, -n:], input_ids[:, -n:]
        hit = pos == position
        for r, c in hit.nonzero().tolist():
            row = torch.full_like(out.logits[r, c], float("-inf"))
            if tok[r, c] == first:
                row[better], row[first] = torch.tensor(q).log(), torch.tensor(1 - q).log()
            else:
                row[better if tok[r, c] == better else first] = 0.0
            out.logits[r, c] = row
        return out

    return forward


@pytest.mark.parametrize("use_cache", [True, False])
def test_edit_fires_above_the_threshold_and_not_below(tiny_model, tiny_tokenizer, monkeypatch, use_cache):
    inputs = _chat(tiny_tokenizer, "hi")
    prompt = inputs["input_ids"].shape[1]
    target = prompt + 2
    monkeypatch.setattr(tiny_model, "forward", _rig(tiny_model, target, 100, 200, 0.8))
    kw = dict(max_new_tokens=16, block_length=8, use_cache=use_cache, return_dict_in_generate=True)
    rec = _Events()
    above = tiny_model.generate(**inputs, editing_threshold=0.75, observers=[rec], **kw)
    below = tiny_model.generate(**inputs, editing_threshold=0.85, **kw)
    assert above.sequences[0, target] == 200 and below.sequences[0, target] == 100
    assert int(above.edits[0]) == 1 and int(below.edits[0]) == 0
    block = target // 8 - prompt // 8
    assert above.edits_per_block[0].tolist() == [1 if b == block else 0 for b in range(int(above.blocks[0]))]
    edited = [e for e in rec.events if e.edited.any()]
    assert len(edited) == 1 and edited[0].edited[0].nonzero().flatten().tolist() == [target % 8]
    assert not (edited[0].edited & (edited[0].committed | edited[0].masked)).any()
    assert edited[0].iteration > 0  # committed first (as 100), edited on a later iteration of the block


def test_prompt_tokens_are_never_edited(tiny_model, tiny_tokenizer, monkeypatch):
    inputs = _chat(tiny_tokenizer, "hi")
    prompt = inputs["input_ids"].shape[1]
    last = int(inputs["input_ids"][0, -1])
    assert prompt % 8  # the first block holds the prompt's tail
    monkeypatch.setattr(tiny_model, "forward", _rig(tiny_model, prompt - 1, last, 200, 0.99))
    out = tiny_model.generate(**inputs, max_new_tokens=8, block_length=8, **EDIT_ALWAYS)
    assert torch.equal(out[:, :prompt], inputs["input_ids"])


def test_editing_off_is_the_llada20_decoder(tiny_model, tiny_tokenizer):
    inputs = _chat(tiny_tokenizer, "what is the weather")
    kw = dict(max_new_tokens=24, block_length=8, threshold=0.9, return_dict_in_generate=True)
    base = tiny_model.generate(**inputs, **kw)
    assert torch.equal(tiny_model.generate(**inputs, max_post_steps=0, **kw).sequences, base.sequences)
    assert base.edits.tolist() == [0] and base.edits_per_block.shape == (1, int(base.blocks[0]))
    # a threshold nothing can exceed: same tokens, one post step per block, whose forward saw the final
    # tokens, so the KV refresh is skipped and the forward count stays the same
    never = tiny_model.generate(**inputs, editing_threshold=1.0, **kw)
    assert torch.equal(never.sequences, base.sequences) and never.edits.tolist() == [0]
    assert int(never.iterations[0]) == int(base.iterations[0]) + int(base.blocks[0])
    assert never.forwards == base.forwards + 1  # the last block has no refresh to save


@pytest.mark.parametrize("steps, kwargs", [
    (8, EDIT_ALWAYS),
    (8, dict(editing_threshold=0.0, max_post_steps=0)),
    # steps < block_length: the 2.1 rule commits one mask per iteration (num_to_transfer=1) where the
    # 2.0 schedule would commit block_length / steps = 4; steps sizes nothing in editing mode
    (2, EDIT_ALWAYS),
    (2, dict(editing_threshold=0.0, max_post_steps=2, num_to_transfer=3)),
    (4, dict(editing_threshold=1.0, max_post_steps=2)),
])
def test_matches_official_21_rules(tiny_model, tiny_tokenizer, official_generate, steps, kwargs):
    cfg = tiny_model.config
    ids = _chat(tiny_tokenizer, "what is the weather")["input_ids"]
    for threshold in (0.95, 1.0):
        want, forwards = official_generate(tiny_model, ids[0], gen_length=24, block_length=8, steps=steps,
                                           threshold=threshold, mask_id=cfg.mask_token_id, eos_id=cfg.eos_token_id,
                                           **kwargs)
        for use_cache in (True, False):
            out = tiny_model.generate(ids, max_new_tokens=24, block_length=8, steps=steps, threshold=threshold,
                                      use_cache=use_cache, return_dict_in_generate=True, **kwargs)
            assert out.sequences[0, ids.shape[1]:].tolist() == want and int(out.iterations[0]) == forwards
            assert (int(out.edits[0]) > 0) == (kwargs["editing_threshold"] < 1.0)


def test_editing_commits_num_to_transfer_per_iteration_not_the_steps_schedule(tiny_model):
    """threshold 1.0 (nothing above it), block 8, steps 2: the 2.0 schedule commits 4 + 4; editing
    mode commits num_to_transfer per iteration whatever steps says (the 2.1 rule)."""
    prompt = torch.arange(5, 21).unsqueeze(0)  # 16 tokens: whole blocks
    kw = dict(max_new_tokens=8, block_length=8, steps=2, threshold=1.0)
    counts = {}
    for name, extra in (("2.0", {}), ("2.1", dict(editing_threshold=1.0)),
                        ("2.1 n=3", dict(editing_threshold=1.0, num_to_transfer=3))):
        rec = _Events()
        tiny_model.generate(prompt, observers=[rec], **kw, **extra)
        counts[name] = [int(e.committed.sum()) for e in rec.events]
    assert counts == {"2.0": [4, 4], "2.1": [1] * 8 + [0], "2.1 n=3": [3, 3, 2, 0]}  # then one post step


def test_cached_equals_uncached_with_editing(tiny_model, tiny_tokenizer):
    inputs = _chat(tiny_tokenizer, "tell me about ships")
    for block_length in (8, 16):
        a, b = (tiny_model.generate(**inputs, max_new_tokens=40, block_length=block_length, use_cache=u,
                                    return_dict_in_generate=True, **EDIT_ALWAYS) for u in (True, False))
        assert torch.equal(a.sequences, b.sequences) and torch.equal(a.edits_per_block, b.edits_per_block)
        assert int(a.edits[0]) > 0


def test_batch_rows_edit_independently(tiny_model, tiny_tokenizer):
    texts = ["hi", "tell me a long story about the sea and ships", "what is 2+2"]
    tiny_tokenizer.padding_side = "left"
    batch = tiny_tokenizer.apply_chat_template([[{"role": "user", "content": t}] for t in texts],
                                               add_generation_prompt=True, return_tensors="pt", return_dict=True,
                                               padding=True)
    out = tiny_model.generate(**batch, max_new_tokens=24, block_length=8, return_dict_in_generate=True,
                              **EDIT_ALWAYS)
    width = batch["input_ids"].shape[1]
    for i, t in enumerate(texts):
        single = tiny_model.generate(**_chat(tiny_tokenizer, t), max_new_tokens=24, block_length=8,
                                     return_dict_in_generate=True, **EDIT_ALWAYS)
        n = single.sequences.shape[1] - _chat(tiny_tokenizer, t)["input_ids"].shape[1]
        assert out.sequences[i, width : width + n].tolist() == single.sequences[0, -n:].tolist()
        assert int(out.edits[i]) == int(single.edits[0]) > 0
        assert int(out.iterations[i]) == int(single.iterations[0])


def test_streamer_gets_final_blocks(tiny_model, tiny_tokenizer):
    inputs = _chat(tiny_tokenizer, "stream please")
    final = tiny_model.generate(**inputs, max_new_tokens=24, block_length=8, **EDIT_ALWAYS)
    text = tiny_tokenizer.decode(final[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    streamer = TextIteratorStreamer(tiny_tokenizer, skip_prompt=True, skip_special_tokens=True)
    thread = threading.Thread(target=tiny_model.generate, kwargs=dict(**inputs, max_new_tokens=24, block_length=8,
                                                                       streamer=streamer, **EDIT_ALWAYS))
    thread.start()
    chunks = list(streamer)
    thread.join()
    assert "".join(chunks) == text


def test_presets_from_argument_and_generation_config(tiny_model, tiny_tokenizer):
    from oled_hf.modeling.params import resolve_params

    cfg = tiny_model.config
    q = resolve_params(cfg, None, 3, {"decoding": "quality"})
    assert (q.threshold, q.editing_threshold, q.max_post_steps, q.decoding) == (0.7, 0.5, 16, "quality")
    s = resolve_params(cfg, GenerationConfig(decoding="quality"), 3, {"decoding": "speed"})
    # the LLaDA2.1 model card's speed mode edits: threshold 0.5, editing_threshold 0.0, 16 post steps
    assert (s.threshold, s.editing_threshold, s.max_post_steps, s.num_to_transfer) == (0.5, 0.0, 16, 1)
    g = resolve_params(cfg, GenerationConfig(decoding="quality", threshold=0.95), 3, {"threshold": 0.8})
    assert (g.threshold, g.editing_threshold) == (0.8, 0.5)  # argument > preset > generation_config
    off = resolve_params(cfg, GenerationConfig(decoding="quality"), 3, {"editing_threshold": None})
    assert off.editing_threshold is None
    assert set(DECODING_PRESETS) == {"quality", "speed"}
    out = tiny_model.generate(**_chat(tiny_tokenizer, "hi"), max_new_tokens=8, block_length=8, decoding="quality",
                              return_dict_in_generate=True)
    assert out.edits_per_block.shape == (1, int(out.blocks[0]))
    speed = tiny_model.generate(**_chat(tiny_tokenizer, "hi"), max_new_tokens=8, block_length=8, decoding="speed",
                                return_dict_in_generate=True)
    assert int(speed.edits[0]) > 0  # speed mode edits (editing_threshold 0.0: wherever the argmax moved)


def test_pipeline_passes_decoding(tiny_model, tiny_tokenizer):
    from transformers import pipeline

    pipe = pipeline("text-generation", model=tiny_model, tokenizer=tiny_tokenizer)
    msgs = [{"role": "user", "content": "hi"}]
    got = pipe(msgs, max_new_tokens=8, block_length=8, return_full_text=False, **EDIT_ALWAYS)[0]["generated_text"]
    ids = _chat(tiny_tokenizer, "hi")
    direct = tiny_model.generate(**ids, max_new_tokens=8, block_length=8, **EDIT_ALWAYS)
    assert got == tiny_tokenizer.decode(direct[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)


@pytest.mark.parametrize("kwargs, message", [
    (dict(decoding="fast"), "decoding='fast'"),
    (dict(editing_threshold=1.5), "editing_threshold=1.5"),
    (dict(editing_threshold="high"), "editing_threshold='high'"),
    (dict(max_post_steps=-1), "max_post_steps=-1"),
    (dict(max_post_steps=2.5), "max_post_steps=2.5"),
    (dict(editing_threshold=0.5, max_post_steps=10**9),
     r"max_post_steps=1000000000 is invalid: must be an integer from 0 to 256"),
    (dict(editing_threshold=0.5, max_post_steps=257), r"max_post_steps=257 is invalid: must be an integer from 0"),
    (dict(editing_threshold=0.5, num_to_transfer=0), r"num_to_transfer=0 is invalid: must be an integer from 1 to "
                                                     r"block_length=32"),
    (dict(editing_threshold=0.5, num_to_transfer=33), r"num_to_transfer=33 is invalid"),
    (dict(editing_threshold=0.5, num_to_transfer=1.5), r"num_to_transfer=1.5 is invalid"),
    (dict(num_to_transfer=2), r"num_to_transfer=2 applies only with token editing"),
])
def test_bad_editing_arguments_raise(tiny_model, kwargs, message):
    forwards = []
    observer = type("O", (), {"on_forward": lambda self, k, b, i: forwards.append(k)})()
    with pytest.raises(ValueError, match=message):
        tiny_model.generate(torch.tensor([[1, 2, 3]]), observers=[observer], **kwargs)
    assert forwards == []


def test_max_post_steps_at_the_bound_ends(tiny_model, tiny_tokenizer):
    """The largest allowed value runs (the shipped toy edits on every post step, so this is the worst case)."""
    from oled_hf.modeling.params import MAX_POST_STEPS

    out = tiny_model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4, block_length=4, editing_threshold=0.0,
                              max_post_steps=MAX_POST_STEPS, return_dict_in_generate=True)
    assert int(out.iterations[0]) <= int(out.blocks[0]) * (4 + MAX_POST_STEPS)


def test_eos_early_stop_waits_for_the_final_block_when_editing(tiny_model, tiny_tokenizer, monkeypatch):
    inputs = _chat(tiny_tokenizer, "hi")
    prompt, eos = inputs["input_ids"].shape[1], tiny_model.config.eos_token_id
    monkeypatch.setattr(tiny_model, "forward", _rig(tiny_model, prompt, eos, 200, 0.0))  # EOS, for sure
    kw = dict(max_new_tokens=16, block_length=8, eos_early_stop=True, threshold=1.0, return_dict_in_generate=True)
    plain = tiny_model.generate(**inputs, **kw)
    edit = tiny_model.generate(**inputs, editing_threshold=1.0, **kw)
    assert plain.sequences[0, prompt:].tolist() == edit.sequences[0, prompt:].tolist() == [eos]
    assert int(plain.iterations[0]) == 1  # stopped mid-block, right after committing the EOS
    masks_in_block = 8 - prompt % 8
    assert int(edit.iterations[0]) == masks_in_block + 1  # the whole block, one mask a step, then a post step
