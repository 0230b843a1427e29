"""``presence_penalty`` / ``frequency_penalty`` (issue 37 item 5): OpenAI's definition over the tokens committed
so far, as a logits processor in block diffusion; zero is exactly no penalty; the server applies them."""

from __future__ import annotations

import pytest
import torch
from oled_hf.modeling.events import IterationEvent

from oled_hf.serve.penalties import Penalty, PenaltyProcessor

MASK, V = 9, 12


def _event(tokens: list[list[int]]) -> IterationEvent:
    t = torch.tensor(tokens)
    ones = torch.ones_like(t, dtype=torch.bool)
    return IterationEvent(0, 0, ones, torch.ones(t.shape), ones, t)


def test_the_penalty_is_openai_s_over_every_decoded_generated_position():
    """logit[t] -= presence * (count[t] > 0) + frequency * count[t]; the prompt's tail is not counted; a token
    decoded after a position counts there too (the block is chosen together)."""
    p = PenaltyProcessor([Penalty(presence=0.5, frequency=0.25), Penalty()], vocab_size=V, mask_token_id=MASK)
    p.on_block_start(0, torch.tensor([[3, MASK, MASK, MASK], [3, 3, MASK, MASK]]))  # 3: the prompt's tail
    p.on_iteration(_event([[3, MASK, 5, 5], [3, 3, 5, MASK]]))
    scores = torch.zeros(8, V)
    out = p(torch.zeros(8, 3, dtype=torch.long), scores).reshape(2, 4, V)
    expected = torch.zeros(V)
    expected[5] = -(0.5 + 0.25 * 2)
    assert torch.equal(out[0], expected.expand(4, V))  # every position of the row, before and after the 5s
    assert torch.equal(out[1], torch.zeros(4, V))  # a row without penalties is untouched
    p.on_block_end(0, torch.tensor([[3, 7, 5, 5], [3, 3, 5, 1]]))
    p.on_block_start(1, torch.full((2, 4), MASK))
    out = p(torch.zeros(8, 7, dtype=torch.long), torch.zeros(8, V)).reshape(2, 4, V)
    expected[7] = -(0.5 + 0.25)
    assert torch.equal(out[0], expected.expand(4, V))
    p.on_iteration(_event([[7, MASK, MASK, MASK], [MASK] * 4]))
    expected[7] = -(0.5 + 0.25 * 2)
    assert torch.equal(p(None, torch.zeros(8, V)).reshape(2, 4, V)[0], expected.expand(4, V))


def test_zero_penalties_leave_scores_bit_identical_and_a_wrong_batch_is_refused():
    p = PenaltyProcessor([Penalty()], vocab_size=V, mask_token_id=MASK)
    p.on_block_start(0, torch.full((1, 4), MASK))
    p.on_iteration(_event([[5, 5, MASK, MASK]]))
    scores = torch.randn(4, V)
    scores[0, 2] = float("-inf")
    assert torch.equal(p(None, scores), scores)
    with pytest.raises(ValueError, match="made for 2 batch rows, but scores has 3 rows"):
        PenaltyProcessor([Penalty(1.0), Penalty(2.0)], V, MASK)(None, torch.zeros(3, V))


@pytest.fixture(scope="module")
def toy():
    from oled_hf.serve.engine import Engine, load_model
    from oled_hf.toy import TOY_CHECKPOINT

    model, tokenizer = load_model(str(TOY_CHECKPOINT), device="cpu")
    return model, tokenizer, Engine(model, tokenizer, max_queue=8, max_batch_size=4)


def _generate(toy, question: str, penalty: Penalty | None, **kwargs) -> list[int]:
    model, _, engine = toy
    ids = engine.encode_chat([{"role": "user", "content": question}])
    extra = {}
    if penalty is not None:
        p = PenaltyProcessor([penalty], model.config.vocab_size, model.config.mask_token_id)
        extra = {"logits_processor": [p], "observers": [p]}
    out = model.generate(ids, max_new_tokens=16, **kwargs, **extra)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("question", ["What is 640+359?", "What is 89+4?"])
def test_a_huge_presence_penalty_forbids_repeating_a_token(toy, question):
    """One commit per iteration (threshold 1.0), so each choice sees every token already committed."""
    eos = toy[0].generation_config.eos_token_id
    plain = _generate(toy, question, None, threshold=1.0)
    assert len(set(plain[:-1])) < len(plain) - 1  # the toy repeats a digit here (999, 01113)
    for penalty in (Penalty(presence=1e4), Penalty(frequency=1e4)):
        tokens = _generate(toy, question, penalty, threshold=1.0)
        answer = tokens[: tokens.index(eos)] if eos in tokens else tokens
        assert len(answer) >= 2 and len(set(answer)) == len(answer), (penalty, tokens)


def test_a_negative_presence_penalty_keeps_the_repeats(toy):
    assert _generate(toy, "What is 640+359?", Penalty(presence=-2.0)) == _generate(toy, "What is 640+359?", None)


@pytest.fixture(scope="module")
def toy_server(toy):
    from oled_hf.serve.app import create_app

    from .conftest import LiveServer

    with LiveServer(create_app(toy[2], "toy")) as live:
        yield live


def _complete(server, **body) -> dict:
    import httpx

    body = {"messages": [{"role": "user", "content": "What is 5+7?"}], "max_tokens": 16, **body}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, trust_env=False, timeout=120).json()


def _text(answer: dict) -> str:
    return answer["choices"][0]["message"]["content"]


def test_the_server_applies_the_penalties_and_zero_is_absent(toy, toy_server):
    _, tokenizer, _ = toy
    plain = _text(_complete(toy_server))
    assert _text(_complete(toy_server, presence_penalty=0, frequency_penalty=0.0)) == plain == "31119"
    for body in ({"presence_penalty": 2.0}, {"frequency_penalty": 1.5}, {"presence_penalty": 1.0,
                                                                         "frequency_penalty": -0.5}):
        penalty = Penalty(body.get("presence_penalty", 0.0), body.get("frequency_penalty", 0.0))
        model = toy[0]
        ids = toy[2].encode_chat([{"role": "user", "content": "What is 5+7?"}])
        p = PenaltyProcessor([penalty], model.config.vocab_size, model.config.mask_token_id)
        out = model.generate(ids, max_new_tokens=16, logits_processor=[p], observers=[p])
        expected = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        assert _text(_complete(toy_server, **body)) == expected, body
    # the toy's answer to 5+7 repeats 1s; presence 2.0 changes it (as the direct generate above does)
    assert _text(_complete(toy_server, presence_penalty=2.0)) != plain


@pytest.mark.parametrize("body, message", [
    ({"presence_penalty": 2.5}, "'presence_penalty' must be in [-2, 2], got 2.5"),
    ({"frequency_penalty": -3}, "'frequency_penalty' must be in [-2, 2], got -3"),
    ({"presence_penalty": "high"}, "'presence_penalty' must be a number, got \"high\""),
])
def test_out_of_range_penalties_are_400_naming_the_field(toy_server, body, message):
    error = _complete(toy_server, **body)["error"]
    assert error["message"] == message and error["param"] == next(iter(body))


def test_penalised_and_plain_requests_never_share_a_batch(toy):
    from oled_hf.serve.engine import GenerationRequest

    _, _, engine = toy
    ids = engine.encode_chat([{"role": "user", "content": "What is 5+7?"}])
    plain, zero, a, b = (GenerationRequest(input_ids=ids, max_tokens=8, emit=print, **kw) for kw in (
        {}, {"presence_penalty": 0.0}, {"presence_penalty": 1.0}, {"frequency_penalty": -1.0}))
    keys = [engine.batch_key(r) for r in (plain, zero, a, b)]
    assert keys[0] == keys[1] and keys[2] == keys[3] and keys[0] != keys[2]
