"""The request bodies as pydantic models: OpenAI's error bodies, the OpenAPI schema and /docs."""

from __future__ import annotations

import pytest

from oled_hf.serve.protocol import APIError
from oled_hf.serve.schema import parse_chat, parse_completion

from .test_errors import CHAT, GOOD, _error

HI = [{"role": "user", "content": "hi"}]


def _refusal(parse, body: dict) -> dict:
    with pytest.raises(APIError) as caught:
        parse(body)
    assert caught.value.status == 400
    return caught.value.body()["error"]


@pytest.mark.parametrize("body, message, param, code", [
    ({"seed": 2**64}, "'seed' must be at least -9223372036854775808 and at most 9223372036854775807, got "
                      "18446744073709551616", "seed", "invalid_value"),
    ({"top_p": 0}, "'top_p' must be in (0, 1], got 0", "top_p", "invalid_value"),
    ({"threshold": 1.5}, "'threshold' must be in [0, 1], got 1.5", "threshold", "invalid_value"),
    ({"max_tokens": True}, "'max_tokens' must be an integer, got true", "max_tokens", "invalid_type"),
    ({"max_completion_tokens": 0}, "'max_completion_tokens' must be at least 1, got 0", "max_completion_tokens",
     "invalid_value"),
    ({"temperature": float("nan")}, "'temperature' must be a number, got NaN", "temperature", "invalid_type"),
    ({"stream_options": {"include_usage": "x"}}, "'include_usage' must be true or false, got \"x\"", "include_usage",
     "invalid_type"),
    ({"model": 5}, "'model' must be a string", "model", "invalid_type"),
    ({"n": 1.0}, "'n' must be 1: this server returns one choice per request (got 1.0)", "n", "unsupported_value"),
    ({"messages": None}, "'messages' is required", "messages", "missing_required_parameter"),
    ({"messages": [{"role": "user"}]}, "messages[0].content must be a string or a list of text parts",
     "messages[0].content", "invalid_type"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content: only text parts are supported", "messages[0].content", "invalid_value"),
    ({"messages": [{"content": "x"}]}, "messages[0].role must be one of system, developer, user, assistant, got null",
     "messages[0].role", "invalid_value"),
])
def test_pydantic_errors_are_openai_errors_with_the_old_wording(body, message, param, code):
    error = _refusal(parse_chat, {"messages": HI, **body})
    assert (error["message"], error["param"], error["code"]) == (message, param, code)


def test_an_integer_too_large_for_a_float_is_400_naming_the_field():
    """It raised OverflowError (a 500) in the hand-written check: math.isfinite(10**400) cannot convert it."""
    error = _refusal(parse_chat, {"messages": HI, "temperature": 10**400})
    assert error["param"] == "temperature" and error["code"] == "invalid_type"
    assert "(401 characters)" in error["message"] and len(error["message"]) < 200


def test_what_is_accepted_reaches_the_engine_options():
    chat = parse_chat({"messages": [{"role": "developer", "content": [{"type": "text", "text": "a"},
                                                                      {"type": "text", "text": "b"}]},
                                    {"role": "assistant", "content": None}],
                       "max_tokens": 5, "max_completion_tokens": 7, "stop": ["x", ""], "temperature": 1,
                       "stream": True, "stream_options": {"include_usage": True}, "presence_penalty": -2,
                       "user": "ignored", "logit_bias": {"5": 0}, "tool_choice": "none"})
    assert chat.messages == [{"role": "system", "content": "ab"}, {"role": "assistant", "content": ""}]
    assert (chat.max_tokens, chat.stop, chat.temperature) == (7, ["x"], 1.0)
    assert chat.stream and chat.include_usage
    assert (chat.presence_penalty, chat.frequency_penalty) == (-2.0, 0.0)
    assert parse_completion({"prompt": [[1, 2]]}).prompt == [1, 2]
    assert parse_completion({"prompt": ["hi"]}).prompt == "hi"
    assert _refusal(parse_completion, {"prompt": ["a", "b"]})["code"] == "unsupported_value"


def test_the_openapi_schema_describes_the_request_bodies(http):
    document = http.get("/openapi.json").json()
    for path, required in (("/v1/chat/completions", "messages"), ("/v1/completions", "prompt")):
        schema = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert required in schema["required"]
        limits = next(s for s in schema["properties"]["max_tokens"]["anyOf"] if s.get("type") == "integer")
        assert limits["minimum"] == 1
    chat = document["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    ref = chat["properties"]["messages"]["items"]["$ref"]
    assert ref == "#/components/schemas/Message"
    assert "role" in document["components"]["schemas"]["Message"]["properties"]
    page = http.get("/docs")
    assert page.status_code == 200 and "swagger" in page.text.lower() and "/openapi.json" in page.text


def test_a_bad_field_over_http_is_still_a_400_naming_it(http):
    _error(http.post(CHAT, json={**GOOD, "top_p": 0}), 400, "top_p", "invalid_value")
