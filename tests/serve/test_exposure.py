"""Issue 13 (server), item 5: API keys that cannot work are refused, --insecure warns, docs sit behind the key."""

from __future__ import annotations

import argparse

import httpx
import pytest

from .test_errors import _error


@pytest.mark.parametrize("key", ["", "   ", "\t", "two words", " padded", "clé"])
def test_unusable_api_keys_are_refused(capsys, tiny_path, engine, key):
    from oled_hf.cli import serve
    from oled_hf.serve.app import create_app

    assert serve.main(["--model", str(tiny_path), "--api-key", key]) == 2
    err = capsys.readouterr().err
    assert "--api-key" in err and ("blank" in err or "visible ASCII" in err)
    with pytest.raises(ValueError, match="--api-key"):
        create_app(engine, "tiny", api_key=key)


def _args(*argv: str) -> argparse.Namespace:
    from oled_hf.cli import serve

    p = argparse.ArgumentParser()
    serve.configure(p)
    return p.parse_args(list(argv))


def test_insecure_on_a_public_address_warns_loudly():
    from oled_hf.cli import serve

    warning = serve.insecure_warning(_args("--host", "0.0.0.0", "--insecure"))
    assert "WARNING" in warning and "WITHOUT AUTHENTICATION" in warning and "0.0.0.0" in warning
    assert serve.check_options(_args("--host", "0.0.0.0", "--insecure")) is None
    assert serve.insecure_warning(_args("--host", "127.0.0.1", "--insecure")) is None
    assert serve.insecure_warning(_args("--host", "0.0.0.0", "--api-key", "k3y")) is None


def test_limit_flags_are_checked():
    from oled_hf.cli import serve

    assert "--max-body-bytes 10" in serve.check_options(_args("--max-body-bytes", "10"))
    assert "--request-timeout -1" in serve.check_options(_args("--request-timeout", "-1"))
    assert "--read-timeout 0" in serve.check_options(_args("--read-timeout", "0"))
    assert serve.limits_from(_args("--request-timeout", "0")).request_timeout is None  # 0: no limit


def test_openapi_schema_is_behind_the_key(auth_server, server):
    with httpx.Client(base_url=auth_server.url, timeout=30, trust_env=False) as c:
        _error(c.get("/openapi.json"), 401, None, "invalid_api_key")
        _error(c.get("/docs"), 401, None, "invalid_api_key")
        key = {"Authorization": f"Bearer {auth_server.api_key}"}
        ok = c.get("/openapi.json", headers=key)
        assert ok.status_code == 200 and "/v1/chat/completions" in ok.json()["paths"]
        assert c.get("/docs", headers=key).status_code == 200 and "/openapi.json" in c.get("/docs", headers=key).text
        _error(c.get("/v1/models", headers={"Authorization": "Bearer"}), 401, None, "invalid_api_key")
    assert httpx.get(f"{server.url}/openapi.json", trust_env=False).status_code == 200  # no key: open
