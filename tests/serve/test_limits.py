"""Issue 13 (server), items 2 and 4: body size, slow and idle connections, clients that leave, time limits."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest

from .conftest import LiveServer
from .test_concurrency import LONG, _aborted, _body
from .test_errors import CHAT, GOOD, _error

SMALL = dict(max_body_bytes=4096, read_timeout=0.5, keep_alive=0.5, max_connections=6, max_header_bytes=2048)


@pytest.fixture(scope="module")
def limited(engine):
    """A second server on the shared engine, with tight limits so that they trip in milliseconds."""
    from oled_hf.serve.app import create_app
    from oled_hf.serve.guard import Limits

    limits = Limits(**SMALL)
    with LiveServer(create_app(engine, "tiny", limits=limits), **limits.uvicorn_options()) as live:
        live.port = int(live.url.rsplit(":", 1)[1])
        yield live


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _response(sock: socket.socket) -> tuple[int, dict]:
    """Status and JSON body of one HTTP/1.1 response with a Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = int(next(line.split(b":")[1] for line in lines if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += sock.recv(65536)
    return int(head.split()[1]), json.loads(body)


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def _healthy(url: str) -> None:
    with httpx.Client(base_url=url, timeout=30, trust_env=False) as c:
        assert c.get("/health").json()["status"] == "ok"
        assert c.post(CHAT, json=GOOD).status_code == 200


# ---- 2: the body limit ----------------------------------------------------------------------------
def test_announced_body_over_the_limit_is_413_before_it_is_read(limited):
    with _connect(limited.port) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 20000000\r\n\r\n")  # and never send the 20 MB
        start = time.monotonic()
        status, body = _response(s)
        assert time.monotonic() - start < 2
    assert status == 413
    err = body["error"]
    assert err["code"] == "request_too_large"
    assert "4096 bytes" in err["message"] and "--max-body-bytes" in err["message"]
    _healthy(limited.url)


def test_chunked_body_is_cut_off_at_the_limit(engine):
    """Without Content-Length the guard counts bytes as they arrive and stops reading at the limit."""
    from oled_hf.serve.guard import Guard, Limits

    reads, sent = [], []

    async def app(scope, receive, send):
        raise AssertionError("the app must not run for an oversized body")

    async def receive():
        reads.append(1)
        return {"type": "http.request", "body": b"x" * 1000, "more_body": True}  # an endless body

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": CHAT, "headers": [(b"content-type", b"application/json")]}
    asyncio.run(Guard(app, engine.metrics, Limits(max_body_bytes=4096))(scope, receive, send))
    assert sent[0]["status"] == 413 and (b"connection", b"close") in sent[0]["headers"]
    assert json.loads(sent[1]["body"])["error"]["code"] == "request_too_large"
    assert len(reads) == 5  # 5000 bytes read > 4096: not one chunk more


def test_body_that_trickles_in_is_408(limited):
    with _connect(limited.port) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"pro")
        status, body = _response(s)
    assert status == 408 and body["error"]["code"] == "request_timeout"
    _healthy(limited.url)


# ---- 4: idle and slow connections, the connection limit -------------------------------------------
def test_headers_over_the_limit_are_refused_by_uvicorn(limited):
    """--max-header-bytes is uvicorn's own h11 limit (issue 27 item 7): an unfinished request head is
    buffered up to it, then refused; no hand-written header parsing."""
    import time

    from oled_hf.serve.guard import Limits

    assert Limits(**SMALL).uvicorn_options()["h11_max_incomplete_event_size"] == 2048
    with _connect(limited.port) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 3000)
        time.sleep(0.1)  # a head still unfinished past the limit
        sock.sendall(b"\r\n\r\n")
        sock.settimeout(5)
        assert sock.recv(65536).startswith(b"HTTP/1.1 400") and _closed_within(sock, 3)
    with _connect(limited.port) as sock:  # under the limit: answered
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 1500)
        time.sleep(0.1)
        sock.sendall(b"\r\n\r\n")
        assert _response(sock)[0] == 200
    assert "--max-header-bytes 100 is invalid" in Limits(max_header_bytes=100).problems()[0]


def test_idle_and_slow_header_connections_are_closed(limited):
    idle, slow = _connect(limited.port), _connect(limited.port)
    slow.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # headers never finished
    try:
        assert _closed_within(idle, 3) and _closed_within(slow, 3)
    finally:
        idle.close()
        slow.close()
    with _connect(limited.port) as kept:  # after a response, keep-alive closes it too
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert _response(kept)[0] == 200
        assert _closed_within(kept, 3)


def test_idle_sockets_past_the_limit_do_not_crowd_out_requests(engine):
    """More idle sockets than --max-connections: the oldest idle ones are closed at once (long before the
    read timeout), and requests are served without waiting."""
    from oled_hf.serve.app import create_app
    from oled_hf.serve.guard import Limits

    limits = Limits(max_connections=6, read_timeout=30)
    with LiveServer(create_app(engine, "tiny", limits=limits), **limits.uvicorn_options()) as live:
        port = int(live.url.rsplit(":", 1)[1])
        hogs = [_connect(port) for _ in range(10)]
        try:
            start = time.monotonic()
            with httpx.Client(base_url=live.url, timeout=10, trust_env=False) as c:
                assert c.get("/health").status_code == 200
                assert c.post(CHAT, json=GOOD).status_code == 200
            assert time.monotonic() - start < 5
            assert all(_closed_within(h, 1) for h in hogs[:4]), "the oldest idle sockets should have been closed"
            assert not _closed_within(hogs[-1], 0.2)  # the newest are kept (until --read-timeout)
        finally:
            for h in hogs:
                h.close()


# ---- 4: clients that leave, and the time limit ----------------------------------------------------
def _wait(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _post_raw(port: int, body: dict) -> socket.socket:
    raw = json.dumps(body).encode()
    s = _connect(port)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(raw), raw))
    return s


def test_non_streamed_client_that_leaves_is_aborted(server, http, engine):
    before = _aborted(http)
    port = int(server.url.rsplit(":", 1)[1])
    # one-token blocks arrive every few tens of ms: a handler that only checks for a departed client
    # when no block has come for a while never notices (the bug this test pins down)
    s = _post_raw(port, {**_body("talk for a long time", max_tokens=LONG, stream=False), "block_length": 1})
    assert _wait(lambda: engine.running == 1, 10)
    time.sleep(0.3)  # well into decoding: blocks keep arriving
    s.close()
    start = time.monotonic()
    assert _wait(lambda: engine.running == 0, 5), "the worker kept decoding for a client that left"
    assert time.monotonic() - start < 2
    assert _wait(lambda: _aborted(http) == before + 1, 5)
    assert http.post(CHAT, json=GOOD).status_code == 200


def test_queued_clients_that_leave_free_their_places_at_once(server, http, engine):
    port = int(server.url.rsplit(":", 1)[1])
    blocker = _post_raw(port, _body("block the worker", max_tokens=LONG, stream=False))
    try:
        assert _wait(lambda: engine.running == 1, 10)
        queued = [_post_raw(port, _body("wait", max_tokens=8, stream=False)) for _ in range(engine.max_queue)]
        assert _wait(lambda: engine.queue_depth == engine.max_queue, 10)
        r = http.post(CHAT, json=_body("no room", max_tokens=8, stream=False))
        assert r.status_code == 429
        for s in queued:
            s.close()
        assert _wait(lambda: engine.queue_depth == 0, 2), "left clients still hold their queue places"
        late = [_post_raw(port, _body("room again", max_tokens=8, stream=False)) for _ in range(engine.max_queue)]
        assert _wait(lambda: engine.queue_depth == engine.max_queue, 10)  # queued, not refused
    finally:
        blocker.close()
    for s in late:
        status, body = _response(s)
        assert status == 200 and body["usage"]["completion_tokens"] == 8
        s.close()


def test_request_timeout_stops_a_long_generation(http, engine, monkeypatch):
    monkeypatch.setattr(engine, "request_timeout", 0.3)
    start = time.monotonic()
    err = _error(http.post(CHAT, json=_body("too long", max_tokens=LONG, stream=False)), 504)
    assert time.monotonic() - start < 5
    assert err["code"] == "request_timeout" and "--request-timeout" in err["message"]
    with http.stream("POST", CHAT, json=_body("too long", max_tokens=LONG)) as r:
        payloads = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert payloads[-1] == "data: [DONE]"
    assert json.loads(payloads[-2][6:])["error"]["code"] == "request_timeout"
    monkeypatch.undo()
    assert http.post(CHAT, json=GOOD).status_code == 200
