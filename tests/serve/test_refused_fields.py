"""Issue 23 item 10 (server): huge integers, answer-changing fields, HEAD /health, long names in errors."""

from __future__ import annotations

import json

import pytest

from .test_errors import CHAT, GOOD, _error

JSON = {"content-type": "application/json"}


def _raw(fields: str) -> bytes:
    """GOOD with extra fields spliced in as raw JSON text (a 5000-digit literal cannot come from a dict)."""
    return json.dumps(GOOD)[:-1].encode() + b", " + fields.encode() + b"}"


@pytest.mark.parametrize("fields, param, digits", [
    ('"user": ' + "9" * 5000, "user", 5000),
    ('"max_tokens": ' + "1" * 4301, "max_tokens", 4301),
    ('"metadata": {"a": [1, -' + "7" * 10_000 + "]}", "metadata.a[1]", 10_000),
])
def test_integer_over_4300_digits_is_400_naming_the_field(http, fields, param, digits):
    """These used to be a 500 with a traceback (int() refuses more than 4300 digits) in any field."""
    err = _error(http.post(CHAT, content=_raw(fields), headers=JSON), 400, param, "invalid_value")
    assert err["message"] == (f"'{param}' is an integer of {digits} digits: this server accepts integers of at "
                              "most 4300 digits")


def test_huge_integer_body_and_the_limit_itself(http):
    err = _error(http.post(CHAT, content=b"1" * 5000, headers=JSON), 400, None, "invalid_value")
    assert err["message"].startswith("the request body is an integer of 5000 digits")
    assert http.post(CHAT, content=_raw('"user": ' + "9" * 4300), headers=JSON).status_code == 200  # ignored field


@pytest.mark.parametrize("field, value, code", [
    ("response_format", {"type": "json_object"}, "unsupported_value"),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}, "unsupported_value"),
    ("response_format", "json", "unsupported_value"),
    ("logit_bias", {"42": 100}, "unsupported_parameter"),
    ("logit_bias", [1, 2], "unsupported_parameter"),
    ("tool_choice", "required", "unsupported_value"),
    ("tool_choice", {"type": "function", "function": {"name": "f"}}, "unsupported_value"),
    ("function_call", {"name": "f"}, "unsupported_value"),
    ("function_call", "required", "unsupported_value"),
])
def test_fields_that_change_the_answer_are_refused(http, field, value, code):
    for path, body in ((CHAT, GOOD), ("/v1/completions", {"prompt": "hi", "max_tokens": 8})):
        err = _error(http.post(path, json={**body, field: value}), 400, field, code)
        assert f"'{field}'" in err["message"] and "not supported" in err["message"]


def test_neutral_values_of_those_fields_are_served(http):
    neutral = {"response_format": {"type": "text"}, "logit_bias": {"42": 0}, "tool_choice": "none",
               "function_call": "auto"}
    plain = http.post(CHAT, json=GOOD).json()["choices"][0]["message"]["content"]
    r = http.post(CHAT, json={**GOOD, **neutral})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == plain
    assert http.post(CHAT, json={**GOOD, "logit_bias": {}, "tool_choice": "auto"}).status_code == 200


def test_head_health_is_200(http):
    r = http.head("/health")
    assert r.status_code == 200 and r.content == b""
    assert r.headers["content-type"] == "application/json"


def test_unknown_model_error_does_not_echo_a_huge_name(http):
    err = _error(http.post(CHAT, json={**GOOD, "model": "m" * 100_000}), 404, "model", "model_not_found")
    assert len(err["message"]) < 200
    assert f"'{'m' * 64}... (100000 characters)' does not exist" in err["message"]
    err = _error(http.get("/v1/models/" + "n" * 5000), 404, "model", "model_not_found")
    assert len(err["message"]) < 200
    err = _error(http.get("/v2/" + "p" * 5000), 404, None, "not_found")
    assert len(err["message"]) < 200 and "(5004 characters)" in err["message"]
