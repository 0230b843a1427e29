import pytest
import torch
from transformers import pipeline


@pytest.fixture(scope="module")
def pipe(tiny_model, tiny_tokenizer):
    return pipeline("text-generation", model=tiny_model, tokenizer=tiny_tokenizer)


def test_plain_prompt_and_return_full_text(pipe, tiny_model, tiny_tokenizer):
    full = pipe("Once upon a time", max_new_tokens=8, block_length=8)[0]["generated_text"]
    new = pipe("Once upon a time", max_new_tokens=8, block_length=8, return_full_text=False)[0]["generated_text"]
    assert full == "Once upon a time" + new
    ids = tiny_tokenizer("Once upon a time", return_tensors="pt")
    direct = tiny_model.generate(**ids, max_new_tokens=8, block_length=8)
    assert new == tiny_tokenizer.decode(direct[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)


def test_chat_messages_use_the_llada2_template(pipe):
    out = pipe([{"role": "user", "content": "hello"}], max_new_tokens=16)[0]["generated_text"]
    assert out[0] == {"role": "user", "content": "hello"}
    assert out[-1]["role"] == "assistant" and isinstance(out[-1]["content"], str)


def test_batch_matches_single(pipe):
    prompts = ["a b", "a much longer prompt with several words in it"]
    batched = pipe(prompts, max_new_tokens=8, block_length=8, batch_size=2, return_full_text=False)
    single = [pipe(p, max_new_tokens=8, block_length=8, return_full_text=False) for p in prompts]
    assert batched == single


def test_max_new_tokens_and_stop_sequence(pipe, tiny_tokenizer):
    ids = pipe("Once upon a time", max_new_tokens=12, block_length=8, return_tensors=True)[0]["generated_token_ids"]
    prompt = len(tiny_tokenizer("Once upon a time")["input_ids"])
    assert len(ids) == prompt + 12
    text = pipe("Once upon a time", max_new_tokens=12, block_length=8, return_full_text=False)[0]["generated_text"]
    stop = text.strip()[:2]
    assert stop
    cut = pipe("Once upon a time", max_new_tokens=12, block_length=8, return_full_text=False,
               stop_sequence=stop)[0]["generated_text"]
    assert cut.endswith(stop) and text.startswith(cut) and len(cut) <= len(text)


def test_pipeline_from_path_with_trust_remote_code(tiny_path):
    pipe = pipeline("text-generation", model=str(tiny_path), trust_remote_code=True)
    out = pipe([{"role": "user", "content": "hello"}], max_new_tokens=16)
    assert out[0]["generated_text"][-1]["role"] == "assistant"
    assert pipe.model.generation_config.do_sample is False
    torch.testing.assert_close(pipe.model.lm_head.weight, pipe.model.lm_head.weight)


def test_pipeline_forwards_hf_controls_and_refuses_typos(pipe, tiny_model, tiny_tokenizer):
    # a generate typo through pipeline() fails as in Transformers instead of being logged and dropped
    with pytest.raises(ValueError, match=r"`model_kwargs` are not used by the model: \[.max_new_token.\]"):
        pipe("Once upon a time", max_new_token=8, block_length=8)
    got = pipe("Once upon a time", max_new_tokens=8, block_length=8, repetition_penalty=50.0, return_tensors=True)
    ids = tiny_tokenizer("Once upon a time", return_tensors="pt")
    direct = tiny_model.generate(**ids, max_new_tokens=8, block_length=8, repetition_penalty=50.0)
    assert got[0]["generated_token_ids"] == direct[0].tolist()
