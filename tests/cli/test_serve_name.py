"""``oled-moe serve`` with no flags: the shipped toy, served under its config's name."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx

from oled_hf.cli.common import default_model_path, served_model_name


def test_served_model_name_comes_from_the_config(tiny_path):
    assert served_model_name(default_model_path()) == "oled-toy-addition"
    assert served_model_name(tiny_path) == "tiny"  # no oled_model_name: the folder's name


def test_serve_defaults_to_the_toy_under_its_name():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "oled_hf.cli.main", "serve", "--port", str(port), "--log-level",
                             "warning"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url, deadline, models = f"http://127.0.0.1:{port}", time.monotonic() + 90, None
        while time.monotonic() < deadline and models is None:
            try:
                models = httpx.get(f"{url}/v1/models", trust_env=False).json()
            except httpx.TransportError:
                assert proc.poll() is None, proc.communicate()[1]
                time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert [m["id"] for m in models["data"]] == ["oled-toy-addition"]
    assert f"oled-moe serve: model 'oled-toy-addition' from {default_model_path()}" in err
