"""The official ``openai`` client against the live server: chat and completions, streamed and not."""

from __future__ import annotations

import pytest

MODEL = "tiny"
MESSAGES = [{"role": "user", "content": "hello there"}]
DIFFUSION = {"block_length": 8}


def _chat(client, **kwargs):
    kwargs.setdefault("max_tokens", 16)
    return client.chat.completions.create(model=MODEL, messages=MESSAGES, extra_body=DIFFUSION, **kwargs)


def test_chat_completion_shape(client):
    r = _chat(client)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == MODEL
    assert len(r.choices) == 1 and r.choices[0].index == 0
    assert r.choices[0].message.role == "assistant" and isinstance(r.choices[0].message.content, str)
    assert r.choices[0].finish_reason == "length"  # the random-weight model never says EOS this soon
    assert r.usage.completion_tokens == 16
    assert r.usage.total_tokens == r.usage.prompt_tokens + 16


def test_chat_stream_equals_non_streamed(client):
    whole = _chat(client, max_tokens=24)
    chunks = list(_chat(client, max_tokens=24, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])
    # one content chunk per completed block: the prompt's partial block, then whole blocks of 8
    content_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content is not None][1:]
    assert 3 <= len(content_chunks) <= 5


def test_stream_without_usage_has_no_usage_chunk(client):
    chunks = list(_chat(client, stream=True))
    assert all(c.choices for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stop_sequence_cuts_the_text_and_reports_stop(client):
    full = _chat(client, max_tokens=32).choices[0].message.content
    visible = [i for i in range(2, len(full) - 1) if full[i : i + 2].isprintable() and "\ufffd" not in full[i : i + 2]]
    if not visible:
        pytest.skip("the tiny model's output has no printable pair to stop on")
    stop = full[visible[0] : visible[0] + 2]
    expected = full[: full.find(stop)]
    r = _chat(client, max_tokens=32, stop=[stop])
    assert r.choices[0].message.content == expected and r.choices[0].finish_reason == "stop"
    streamed = list(_chat(client, max_tokens=32, stop=stop, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == expected
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_max_completion_tokens_and_seeded_sampling(client):
    assert _chat(client, max_tokens=None, max_completion_tokens=8).usage.completion_tokens == 8
    a = _chat(client, temperature=0.9, top_p=0.9, seed=7).choices[0].message.content
    b = _chat(client, temperature=0.9, top_p=0.9, seed=7).choices[0].message.content
    assert a == b
    assert _chat(client, temperature=0).choices[0].message.content == _chat(client).choices[0].message.content


def test_default_max_tokens(client):
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, extra_body=DIFFUSION)
    assert r.usage.completion_tokens == 16  # the engine's default_max_tokens


def test_completions(client):
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=16, extra_body=DIFFUSION)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 16
    chunks = list(client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=16, stream=True,
                                            stream_options={"include_usage": True}, extra_body=DIFFUSION))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
    assert chunks[-1].usage.completion_tokens == 16
    ids = client.completions.create(model=MODEL, prompt=[5, 6, 7, 8], max_tokens=8, extra_body=DIFFUSION)
    assert ids.usage.prompt_tokens == 4 and ids.usage.completion_tokens == 8


def test_models(client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
