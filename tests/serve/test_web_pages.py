"""Issue 23 item 4: a web page cannot drive the key-less loopback server.

A page can POST ``text/plain``, form or multipart bodies cross-origin without a CORS preflight, and
a DNS-rebinding page reaches a loopback server under its own name. So only ``application/json``
bodies are read (415 otherwise) and ``Host`` must be a loopback name, the bound address or one
given with ``--allowed-hosts`` (421 otherwise); no CORS header is ever sent.
"""

from __future__ import annotations

import json

import httpx
import pytest

from .test_errors import CHAT, GOOD, _error

BODY = json.dumps(GOOD).encode()


@pytest.mark.parametrize("kwargs, shown", [
    ({"content": BODY, "headers": {"content-type": "text/plain"}}, "'text/plain'"),
    ({"content": BODY, "headers": {"content-type": "text/plain;charset=UTF-8"}}, "'text/plain;charset=UTF-8'"),
    ({"data": {"messages": "hi"}}, "'application/x-www-form-urlencoded'"),
    ({"files": {"body": ("body.json", BODY, "application/json")}}, "'multipart/form-data; boundary="),
    ({"content": BODY}, "no Content-Type header"),
    ({"content": BODY, "headers": {"content-type": "application/json; charset=latin-1"}}, "must be UTF-8"),
    ({"content": BODY, "headers": {"content-type": "application/jsonp"}}, "'application/jsonp'"),
])
def test_bodies_a_page_can_send_without_preflight_are_415(http, kwargs, shown):
    for path in (CHAT, "/v1/completions"):
        err = _error(http.post(path, **kwargs), 415, None, "unsupported_media_type")
        assert shown in err["message"]
        if "UTF-8" not in shown:
            assert "accepts only 'application/json'" in err["message"]


def test_json_bodies_with_a_charset_are_served(http):
    for content_type in ("application/json", "application/json; charset=utf-8", "Application/JSON;charset=\"UTF-8\""):
        r = http.post(CHAT, content=BODY, headers={"content-type": content_type})
        assert r.status_code == 200, (content_type, r.text)


@pytest.mark.parametrize("host, name", [
    ("evil.example", "evil.example"), ("Evil.Example:8000", "evil.example"), ("127.0.0.1.nip.io", "127.0.0.1.nip.io"),
    ("localhost.evil.example", "localhost.evil.example"), ("10.0.0.5", "10.0.0.5"),
    ("[2001:db8::1]:8000", "2001:db8::1"),
])
def test_foreign_host_names_are_421(http, host, name):
    """A DNS-rebinding page's requests carry its own name: refused before anything runs, GETs included."""
    err = _error(http.post(CHAT, json=GOOD, headers={"Host": host}), 421, None, "invalid_host")
    assert f"the Host header names '{name}'" in err["message"]
    assert "DNS-rebinding" in err["message"] and "--allowed-hosts" in err["message"]
    for path in ("/health", "/v1/models", "/metrics"):
        _error(http.get(path, headers={"Host": host}), 421, None, "invalid_host")


@pytest.mark.parametrize("host", ["x y", "evil.example:port", "[::1", "", "a/b"])
def test_malformed_host_is_400(http, host):
    err = _error(http.get("/health", headers={"Host": host}), 400, None, "invalid_host")
    assert "malformed" in err["message"]


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST:1234", "localhost.", "app.localhost:8000", "127.0.0.1",
                                  "127.0.0.2:80", "[::1]", "[::1]:8000"])
def test_loopback_host_names_are_served(http, host):
    assert http.get("/health", headers={"Host": host}).status_code == 200
    assert http.post(CHAT, json=GOOD, headers={"Host": host}).status_code == 200


def test_keyed_loopback_server_checks_host_and_content_type(auth_server):
    ok = {"Authorization": f"Bearer {auth_server.api_key}"}
    with httpx.Client(base_url=auth_server.url, timeout=60, trust_env=False) as c:
        _error(c.post(CHAT, json=GOOD, headers={**ok, "Host": "evil.example"}), 421, None, "invalid_host")
        _error(c.post(CHAT, content=BODY, headers={**ok, "content-type": "text/plain"}), 415, None,
               "unsupported_media_type")
        assert c.post(CHAT, json=GOOD, headers=ok).status_code == 200


def test_no_cors_headers_ever(http):
    """No Access-Control-Allow-Origin: another origin can neither pass a preflight nor read an answer."""
    origin = {"Origin": "http://evil.example"}
    preflight = http.options(CHAT, headers={**origin, "Access-Control-Request-Method": "POST",
                                            "Access-Control-Request-Headers": "content-type"})
    assert preflight.status_code == 405
    answered = http.post(CHAT, json=GOOD, headers=origin)
    assert answered.status_code == 200
    for r in (preflight, answered, http.get("/health", headers=origin)):
        assert not any(k.lower().startswith("access-control-") for k in r.headers), r.headers


def test_host_policy_rules():
    from oled_hf.serve.guard import host_policy

    loopback = host_policy("127.0.0.1", None)
    assert loopback.allows("localhost") and loopback.allows("a.b.localhost") and loopback.allows("::1")
    assert not loopback.allows("evil.example") and not loopback.allows("192.168.1.2")
    named = host_policy("127.0.0.1", None, ["gpu.lan", ".example.com"])
    assert named.allows("gpu.lan") and named.allows("example.com") and named.allows("api.example.com")
    assert not named.allows("badexample.com") and not named.allows("gpu.lan.evil")
    lan = host_policy("192.168.1.2", None)
    assert lan.allows("192.168.1.2") and not lan.allows("192.168.1.3") and not lan.allows("gpu.lan")
    everywhere = host_policy("0.0.0.0", None)  # every interface: any IP literal (it cannot be rebound), no names
    assert everywhere.allows("10.1.2.3") and everywhere.allows("fe80::1") and not everywhere.allows("gpu.lan")
    assert host_policy("0.0.0.0", "key") is None  # the key guards a public keyed server
    assert host_policy("0.0.0.0", "key", ["gpu.lan"]).allows("gpu.lan")
    assert host_policy("127.0.0.1", "key") is not None  # a keyed loopback server still checks
    assert host_policy("127.0.0.1", None, ["*"]) is None


@pytest.mark.parametrize("entry", ["http://gpu.lan", "gpu.lan:8000", "", "a b", "."])
def test_bad_allowed_hosts_are_refused(capsys, tiny_path, engine, entry):
    from oled_hf.cli import serve
    from oled_hf.serve.app import create_app

    with pytest.raises(ValueError, match="--allowed-hosts entry"):
        create_app(engine, "tiny", allowed_hosts=[entry])
    if entry.strip():
        assert serve.main(["--model", str(tiny_path), "--allowed-hosts", entry]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--allowed-hosts entry {entry!r} is invalid" in err


def test_allowed_hosts_flag_parses():
    import argparse

    from oled_hf.cli import serve

    p = argparse.ArgumentParser()
    serve.configure(p)
    args = p.parse_args(["--allowed-hosts", "gpu.lan, .example.com,,"])
    assert args.allowed_hosts == ["gpu.lan", ".example.com"] and serve.check_options(args) is None
    assert p.parse_args([]).allowed_hosts == []
