"""The ``serve`` command: it refuses unsafe or bad options before loading, and serves when asked."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx


def test_serve_refuses_public_host_without_key(capsys, tiny_path):
    from oled_hf.cli import serve

    for host in ("0.0.0.0", "192.168.1.20", "example.com"):
        assert serve.main(["--model", str(tiny_path), "--host", host]) == 2
        err = capsys.readouterr().err
        assert f"refusing to listen on {host} without --api-key" in err and "--insecure" in err
    assert serve.main(["--model", str(tiny_path), "--max-queue", "0"]) == 2
    assert serve.is_loopback("127.0.0.1") and serve.is_loopback("localhost") and serve.is_loopback("::1")
    assert not serve.is_loopback("0.0.0.0") and not serve.is_loopback("10.0.0.1")


def test_serve_reports_missing_model(capsys, tmp_path):
    from oled_hf.cli import serve

    assert serve.main(["--model", str(tmp_path / "missing")]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_serve_command_starts_and_stops(tiny_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "oled_hf.cli.serve", "--model", str(tiny_path), "--port",
                             str(port), "--block-length", "8", "--default-max-tokens", "8", "--log-level", "warning",
                             "--served-model-name", "tiny-cli"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", trust_env=False).status_code == 200:
                    break
            except httpx.TransportError:
                assert proc.poll() is None, proc.communicate()[1]
                time.sleep(0.1)
        body = {"model": "tiny-cli", "prompt": "hello"}
        r = httpx.post(f"{url}/v1/completions", json=body, trust_env=False, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert f"OpenAI API at http://127.0.0.1:{port}/v1" in err
