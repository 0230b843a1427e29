"""One generation at a time, a bounded queue, 429 when full, and clients that leave free the worker."""

from __future__ import annotations

import json
import threading
import time

import httpx

CHAT = "/v1/chat/completions"
PROMPTS = ["one", "two two", "three three three", "four"]
LONG = 4000  # tokens: minutes of decoding unless the abort works


def _body(prompt: str, max_tokens: int = 24, stream: bool = True) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "block_length": 8, "stream": stream}


def _expected(http) -> dict[str, str]:
    out = {}
    for p in PROMPTS:
        r = http.post(CHAT, json=_body(p, stream=False))
        assert r.status_code == 200
        out[p] = r.json()["choices"][0]["message"]["content"]
    return out


def _stream_once(url: str, prompt: str, results: list, start: threading.Barrier | None = None) -> None:
    if start is not None:
        start.wait()
    with httpx.Client(base_url=url, timeout=120, trust_env=False) as c, \
            c.stream("POST", CHAT, json=_body(prompt)) as r:
        if r.status_code != 200:
            r.read()
            results.append((prompt, r.status_code, r.json(), r.headers.get("retry-after")))
            return
        payloads = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
        results.append((prompt, 200, payloads, None))


def _check(results: list, expected: dict[str, str]) -> tuple[int, int]:
    done = rejected = 0
    for prompt, status, payload, retry_after in results:
        if status == 429:
            assert payload["error"]["code"] == "queue_full" and payload["error"]["type"] == "rate_limit_error"
            assert retry_after == "1"
            rejected += 1
            continue
        assert status == 200
        assert payload[-1] == "[DONE]", "a stream ended without [DONE]"
        chunks = [json.loads(p) for p in payload[:-1]]
        assert len({c["id"] for c in chunks}) == 1, "chunks of two requests were mixed"
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        assert text == expected[prompt], f"stream for {prompt!r} is not the greedy answer"
        assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
        done += 1
    return done, rejected


def test_more_requests_than_the_queue_holds(server, http):
    expected = _expected(http)
    results: list = []
    barrier = threading.Barrier(8)
    threads = [threading.Thread(target=_stream_once, args=(server.url, PROMPTS[i % 4], results, barrier))
               for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    done, rejected = _check(results, expected)
    assert done + rejected == 8 and done >= 1


def test_full_queue_answers_429_at_once(server, http, engine):
    """A running request plus max_queue=2 waiting ones: the other six of eight are refused immediately."""
    expected = _expected(http)
    results: list = []
    with httpx.Client(base_url=server.url, timeout=120, trust_env=False) as blocker_client, \
            blocker_client.stream("POST", CHAT, json=_body("block the worker", max_tokens=LONG)) as blocker:
        lines = blocker.iter_lines()  # keep a reference: closing the iterator would hang up
        assert next(line for line in lines if line.startswith("data: "))  # decoding has started
        threads = [threading.Thread(target=_stream_once, args=(server.url, PROMPTS[i % 4], results))
                   for i in range(8)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while (len(results) < 6 or engine.queue_depth < 2) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(results) == 6 and all(status == 429 for _, status, _, _ in results)
        assert engine.queue_depth == 2
    # the blocker's client left: its generation stops at the next block and the two queued ones run
    for t in threads:
        t.join(120)
    assert _check(results, expected) == (2, 6)


def _metric(http, name: str) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.rsplit(" ", 1)[0] == name:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _aborted(http) -> float:
    return _metric(http, 'oled_generations_total{outcome="aborted"}')


def test_client_that_disconnects_mid_stream_frees_the_worker(server, http, engine):
    before = _aborted(http)
    with httpx.Client(base_url=server.url, timeout=120, trust_env=False) as c, \
            c.stream("POST", CHAT, json=_body("talk for a long time", max_tokens=LONG)) as r:
        received = 0
        for line in r.iter_lines():  # read a few blocks, then hang up
            received += line.startswith("data: ")
            if received >= 3:
                break
    start = time.monotonic()
    reply = http.post(CHAT, json=_body("next", max_tokens=8, stream=False))
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 8
    assert time.monotonic() - start < 10  # decoding all LONG tokens takes far longer than this
    deadline = time.monotonic() + 10
    while _aborted(http) < before + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _aborted(http) == before + 1
    assert engine.running == 0 and engine.queue_depth == 0


def test_client_that_leaves_while_queued_is_skipped(server, http, engine):
    gone = 'oled_requests_total{endpoint="/v1/chat/completions",status="499"}'
    before, before_gone = _aborted(http), _metric(http, gone)
    with httpx.Client(base_url=server.url, timeout=120, trust_env=False) as blocker_client, \
            blocker_client.stream("POST", CHAT, json=_body("block the worker", max_tokens=LONG)) as blocker:
        lines = blocker.iter_lines()  # keep a reference: closing the iterator would hang up
        assert next(line for line in lines if line.startswith("data: "))
        with httpx.Client(base_url=server.url, timeout=1.0, trust_env=False) as impatient:
            try:
                r = impatient.post(CHAT, json=_body("impatient", stream=False))
                raise AssertionError(f"the queued request should still be waiting: {r.status_code} {r.text}")
            except httpx.ReadTimeout:
                pass
        # the server notices the hang-up at once: the queue place is free while the blocker still runs
        deadline = time.monotonic() + 2
        while engine.queue_depth and time.monotonic() < deadline:
            time.sleep(0.02)
        assert engine.queue_depth == 0 and engine.running == 1
        # ... and answers (nobody) 499
        deadline = time.monotonic() + 10
        while _metric(http, gone) < before_gone + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
    deadline = time.monotonic() + 10
    while (_aborted(http) < before + 2 or engine.queue_depth or engine.running) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _aborted(http) == before + 2  # the blocker (mid-stream) and the impatient one (never started)
    assert engine.queue_depth == 0 and engine.running == 0
