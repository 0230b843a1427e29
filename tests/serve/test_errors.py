"""Bad requests get OpenAI error objects with the right status, and the server keeps serving."""

from __future__ import annotations

import httpx
import pytest

CHAT = "/v1/chat/completions"
GOOD = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "block_length": 8}


def _error(response, status, param=None, code=None):
    assert response.status_code == status, response.text
    err = response.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param
    if code is not None:
        assert err["code"] == code
    return err


@pytest.mark.parametrize("body, param, code", [
    ({"model": "tiny"}, "messages", "missing_required_parameter"),
    ({**GOOD, "messages": "hi"}, "messages", "invalid_type"),
    ({**GOOD, "messages": []}, "messages", "invalid_type"),
    ({**GOOD, "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "invalid_value"),
    ({**GOOD, "messages": [{"role": "user", "content": 5}]}, "messages[0].content", "invalid_type"),
    ({**GOOD, "max_tokens": "8"}, "max_tokens", "invalid_type"),
    ({**GOOD, "max_tokens": True}, "max_tokens", "invalid_type"),
    ({**GOOD, "max_tokens": 0}, "max_tokens", "invalid_value"),
    ({**GOOD, "max_tokens": 100_000}, "max_tokens", "context_length_exceeded"),
    ({**GOOD, "n": 2}, "n", "unsupported_value"),
    ({**GOOD, "temperature": "hot"}, "temperature", "invalid_type"),
    ({**GOOD, "temperature": 3}, "temperature", "invalid_value"),
    ({**GOOD, "top_p": 0}, "top_p", "invalid_value"),
    ({**GOOD, "stop": ["a", "b", "c", "d", "e"]}, "stop", "invalid_value"),
    ({**GOOD, "stop": 3}, "stop", "invalid_type"),
    ({**GOOD, "threshold": 1.5}, "threshold", "invalid_value"),
    ({**GOOD, "block_length": 0}, "block_length", "invalid_value"),
    ({**GOOD, "block_length": 10**6}, "block_length", "invalid_value"),
    ({**GOOD, "stream": "yes"}, "stream", "invalid_type"),
    ({**GOOD, "messages": [{"role": "user", "content": "hello " * 5000}]}, "messages", "context_length_exceeded"),
])
def test_chat_validation(http, body, param, code):
    _error(http.post(CHAT, json=body), 400, param, code)


@pytest.mark.parametrize("body, param", [
    ({"model": "tiny"}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": {"text": "x"}}, "prompt"),
    ({"prompt": [5] * 5000}, "prompt"),
    ({"prompt": [10**7]}, "prompt"),
    ({"prompt": "hi", "max_tokens": -1}, "max_tokens"),
])
def test_completion_validation(http, body, param):
    _error(http.post("/v1/completions", json=body), 400, param)


def test_malformed_json_and_non_object(http):
    _error(http.post(CHAT, content=b"{not json", headers={"content-type": "application/json"}), 400, None,
           "invalid_json")
    _error(http.post(CHAT, json=[1, 2]), 400, None, "invalid_json")
    _error(http.post(CHAT, content=b"\xff\xfe", headers={"content-type": "application/json"}), 400, None,
           "invalid_json")


def test_unknown_model_is_404(http):
    _error(http.post(CHAT, json={**GOOD, "model": "gpt-4o"}), 404, "model", "model_not_found")
    _error(http.post("/v1/completions", json={"model": "nope", "prompt": "x"}), 404, "model", "model_not_found")
    _error(http.get("/v1/models/nope"), 404, "model", "model_not_found")


def test_unknown_route_and_method(http):
    _error(http.get("/v2/whatever"), 404, None, "not_found")
    _error(http.get(CHAT), 405, None, "method_not_allowed")


def test_errors_raised_by_generate(http, engine, monkeypatch):
    def refuse(*args, **kwargs):
        raise ValueError("threshold=7 is invalid: must be between 0 and 1 (inclusive)")

    monkeypatch.setattr(engine.model, "generate", refuse)
    assert "threshold=7" in _error(http.post(CHAT, json=GOOD), 400)["message"]
    assert "threshold=7" in _error(http.post(CHAT, json={**GOOD, "stream": True}), 400)["message"]

    def crash(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(engine.model, "generate", crash)
    err = _error(http.post("/v1/completions", json={"prompt": "x", "max_tokens": 8}), 500)
    assert err["type"] == "server_error" and "boom" in err["message"]
    monkeypatch.undo()
    assert http.post(CHAT, json=GOOD).status_code == 200


def test_server_keeps_serving_after_errors(http):
    for _ in range(2):
        http.post(CHAT, content=b"][", headers={"content-type": "application/json"})
        http.post(CHAT, json={**GOOD, "max_tokens": 0})
    r = http.post(CHAT, json=GOOD)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    assert http.get("/health").json()["status"] == "ok"


def test_api_key(auth_server):
    key = auth_server.api_key
    with httpx.Client(base_url=auth_server.url, timeout=60, trust_env=False) as http:
        _error(http.post(CHAT, json=GOOD), 401, None, "invalid_api_key")
        _error(http.post(CHAT, json=GOOD, headers={"Authorization": "Bearer wrong"}), 401, None, "invalid_api_key")
        _error(http.get("/v1/models", headers={"Authorization": key}), 401, None, "invalid_api_key")
        _error(http.get("/metrics"), 401, None, "invalid_api_key")
        assert http.get("/health").status_code == 200
        ok = {"Authorization": f"Bearer {key}"}
        assert http.post(CHAT, json=GOOD, headers=ok).status_code == 200
        assert http.get("/v1/models", headers=ok).json()["data"][0]["id"] == "tiny"


def test_openai_client_sees_typed_errors(client):
    import openai

    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=GOOD["messages"])
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=GOOD["messages"], n=3)
    assert info.value.param == "n"
