"""A live server on a free loopback port, shared by the serve tests (one tiny model, one worker)."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

MODEL_NAME = "tiny"
API_KEY = "sk-test-key"


class LiveServer:
    """uvicorn in a background thread, on a socket bound before it starts (no port race)."""

    def __init__(self, app, **config):
        import uvicorn

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY (asyncio)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", **config))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=2, trust_env=False).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError("the test server did not answer /health within 30 s")

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.sock.close()


@pytest.fixture(scope="session")
def engine(tiny_path):
    from oled_hf.serve.engine import Engine, load_model

    model, tokenizer = load_model(str(tiny_path), device="cpu")
    engine = Engine(model, tokenizer, max_queue=2, default_max_tokens=16, block_length=8)
    engine.start()
    yield engine
    engine.stop()


@pytest.fixture(scope="session")
def server(engine):
    from oled_hf.serve.app import create_app

    with LiveServer(create_app(engine, MODEL_NAME)) as live:
        yield live


@pytest.fixture(scope="session")
def auth_server(engine):
    from oled_hf.serve.app import create_app

    with LiveServer(create_app(engine, MODEL_NAME, api_key=API_KEY)) as live:
        live.api_key = API_KEY
        yield live


@pytest.fixture()
def client(server):
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60,
                         http_client=httpx.Client(trust_env=False))


@pytest.fixture()
def http(server):
    """Raw HTTP against the shared server (proxies from the environment ignored)."""
    with httpx.Client(base_url=server.url, timeout=60, trust_env=False) as c:
        yield c
