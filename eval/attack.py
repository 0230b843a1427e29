"""Hostile requests against a real ``oled-moe serve`` (loopback only), then hostile command lines and Python calls.

Server half (issues 13, 23, 35.5, 37.5): starts ``python -m oled_hf.cli.serve`` on a free 127.0.0.1 port
(a fresh tiny checkpoint unless ``--model`` is given; 256 file descriptors, short read and request
timeouts), first with an API key (``KEYED_CASES``: huge seeds and bodies, nested JSON, surrogates,
disconnects, idle and slow sockets, control tokens), then the default way without a key
(``WEB_CASES``: what a web page could send, huge integers, refused fields, penalties), while a monitor
polls ``/health`` on a new connection every 0.25 s; after every case a normal request must still get a
200. Then ``OWN_SERVER_CASES``, each on a server started with its own flags (35.5: a lone request after
a burst must not wait the whole --batch-wait-ms).

CLI half (issues 13.5, 35, 37): ``eval/attack_cli.py``'s ``CASES`` (records over files and links,
corrupted traces, out-of-range synth parameters, writes into a read-only folder or past ``ulimit -f``,
``--device cuda`` without CUDA, ``~nouser`` paths, budget flags, the official 4-D mask, QK-norm and
tie rule, extreme repetition_penalty, accelerate's offload options, tokenizer padding), each in a
fresh, memory-limited interpreter.

Prints one line per case, labelled with its issue item ("35.1 record over a file/link"): pass or FAIL,
for server cases the slowest /health answer during the case and whether the next request was served
('-' for the others), then what happened. Exit status 0 only if every case passed.

    .venv/bin/python eval/attack.py                 # both halves: about 22 minutes on 2 busy cores
    .venv/bin/python eval/attack.py --only server   # about 2.5 minutes
    .venv/bin/python eval/attack.py --only cli      # about 20: some 45 fresh interpreters, 20-60 s each
    .venv/bin/python eval/attack.py --case 35.8 --case "13.5 blank"   # only the labels starting so

Every socket goes to 127.0.0.1; every wait has a timeout; every server is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))  # eval/ is not a package: its sibling by path
import attack_cli  # noqa: E402
from attack_cli import WIDTH, row  # noqa: E402

KEY = "attack-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = "/v1/chat/completions"
FD_LIMIT = 256  # the server's descriptor limit: the idle-socket flood used to exhaust it
LONG = 4000  # tokens: minutes of decoding unless an abort works


def _chat(content: str = "hi", max_tokens: int = 8, **extra) -> dict:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "block_length": 8,
            **extra}


class Server:
    """The CLI server in a subprocess, with a /health monitor thread; ``key`` None: the default, key-less server."""

    def __init__(self, model: str, args, key: str | None = KEY, extra: tuple[str, ...] = ()):
        """``extra``: more serve flags, after the attack's own (argparse keeps the last of a repeated flag)."""
        self.model, self.args = model, args
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.auth = {"Authorization": f"Bearer {key}"} if key else {}
        cmd = [sys.executable, "-m", "oled_hf.cli.serve", "--model", model, "--host", "127.0.0.1",
               "--port", str(self.port), *(["--api-key", key] if key else []), "--block-length", "8",
               "--default-max-tokens", "8",
               "--max-queue", "2", "--read-timeout", str(args.read_timeout), "--request-timeout",
               str(args.request_timeout), "--max-body-bytes", str(args.max_body_bytes), "--log-level", "error",
               *extra]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        # stderr goes to a file: a pipe nobody reads fills up and would freeze the server's event loop
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=self.log, text=True,
                                     preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE,
                                                                           (FD_LIMIT, FD_LIMIT)))
        self.slowest, self.failures, self._stop = 0.0, 0, threading.Event()

    def wait_ready(self, seconds: float = 90) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"the server exited: {self.log.read()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2, trust_env=False).status_code == 200:
                    threading.Thread(target=self._monitor, daemon=True).start()
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError("the server did not start")

    def _monitor(self) -> None:
        while not self._stop.is_set():
            start = time.monotonic()
            try:
                ok = httpx.get(f"{self.url}/health", timeout=5, trust_env=False).status_code == 200
            except httpx.HTTPError:
                ok = False
            self.slowest = max(self.slowest, time.monotonic() - start)
            self.failures += not ok
            self._stop.wait(0.25)

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=5, trust_env=False).json()

    def post(self, path: str, body=None, raw: bytes | None = None, timeout: float = 60) -> httpx.Response:
        headers = {**self.auth, "content-type": "application/json"}
        content = raw if raw is not None else json.dumps(body).encode()
        return httpx.post(self.url + path, content=content, headers=headers, timeout=timeout, trust_env=False)

    def request(self, method: str, path: str, headers: dict | None = None, **kwargs) -> httpx.Response:
        """Any request, with exactly these headers (plus the key, if any); httpx adds no Content-Type to bytes."""
        return httpx.request(method, self.url + path, headers={**self.auth, **(headers or {})}, timeout=60,
                             trust_env=False, **kwargs)

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)

    def raw_post(self, body: dict) -> socket.socket:
        data = json.dumps(body).encode()
        s = self.connect()
        s.sendall(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                  % (CHAT.encode(), KEY.encode(), len(data), data))
        return s

    def resources(self) -> str:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        rss = next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS"))
        fds = len(os.listdir(f"/proc/{self.proc.pid}/fd"))
        return f"rss {int(rss) // 1024} MiB, {fds} open descriptors (limit {FD_LIMIT})"

    def stop(self) -> None:
        self._stop.set()
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _wait(condition: Callable[[], bool], seconds: float) -> float | None:
    """Seconds until ``condition`` held, or None if it did not within ``seconds``."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if condition():
            return time.monotonic() - start
        time.sleep(0.05)
    return None


def _status(r: httpx.Response) -> str:
    try:
        code = r.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = "-" if r.status_code == 200 else "NOT AN ERROR OBJECT"
    return f"{r.status_code} {code}"


def _closed(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:  # reset by the server: closed too
        return True


# ---- the cases: each returns (what happened, passed) ---------------------------------------------------
def seed_2_64(srv):
    r = srv.post(CHAT, _chat(seed=2**64))
    return _status(r), r.status_code == 400


def body_20mb(srv):
    """20 MB announced and actually sent: 413 before the body is read, memory untouched."""
    s, start = srv.connect(), time.monotonic()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: 20000000\r\n\r\n")
    with s:
        try:
            chunk = b'{"prompt": "' + b"a" * (1 << 20)
            for _ in range(20):
                s.sendall(chunk)
        except OSError:
            pass  # the server answered and closed: what it should do
        s.settimeout(10)
        try:
            head = s.recv(4096).split(b"\r\n", 1)[0].decode()
        except OSError as err:
            head = f"connection closed ({type(err).__name__})"
    return f"{head} in {time.monotonic() - start:.2f} s", "413" in head or "closed" in head


def prompt_1mb(srv):
    start = time.monotonic()
    r = srv.post("/v1/completions", {"prompt": "hello world " * 85_000})
    return f"{_status(r)} in {time.monotonic() - start:.2f} s", r.status_code == 400


def nested_json(srv):
    r = srv.post(CHAT, raw=b"[" * 100_000)
    return _status(r), r.status_code == 400 and "error" in r.json()


def surrogate_prompt(srv):
    r = srv.post("/v1/completions", raw=b'{"prompt": "a\\ud800b"}')
    return _status(r), r.status_code == 400 and "error" in r.json()


def surrogate_model(srv):
    r = srv.post("/v1/completions", raw=b'{"model": "\\ud800", "prompt": "x"}')
    return _status(r), r.status_code == 400 and "error" in r.json()


def temperature_1e_300(srv):
    r = srv.post(CHAT, _chat(temperature=1e-300))
    return _status(r), r.status_code == 400


def control_tokens_in_chat(srv):
    r = srv.post(CHAT, _chat("<|mask|> <role>HUMAN</role> <|role_end|>"))
    return _status(r), r.status_code == 200


def mask_id_prompt(srv):
    mask_id = json.loads((Path(srv.model) / "config.json").read_text())["mask_token_id"]
    r = srv.post("/v1/completions", {"prompt": [5, mask_id, 6], "max_tokens": 8})
    return _status(r), r.status_code == 400


def non_streamed_disconnect(srv):
    s = srv.raw_post({**_chat("talk", max_tokens=LONG), "block_length": 1})
    _wait(lambda: srv.health()["running"] == 1, 10)
    time.sleep(0.5)
    s.close()
    took = _wait(lambda: srv.health()["running"] == 0, 10)
    return (f"worker free {took:.2f} s after the hang-up" if took is not None else "worker still busy after 10 s",
            took is not None and took < 2)


def queued_clients_leave(srv):
    blocker = srv.raw_post(_chat("block", max_tokens=LONG))
    try:
        _wait(lambda: srv.health()["running"] == 1, 10)
        queued = [srv.raw_post(_chat("wait")) for _ in range(2)]
        _wait(lambda: srv.health()["queue_depth"] == 2, 10)
        for s in queued:
            s.close()
        took = _wait(lambda: srv.health()["queue_depth"] == 0, 5)
        late = [srv.raw_post(_chat("room")) for _ in range(2)]
        queued_again = _wait(lambda: srv.health()["queue_depth"] == 2, 5) is not None
        for s in late:
            s.close()
    finally:
        blocker.close()
    text = f"places freed in {took:.2f} s" if took is not None else "places still held after 5 s"
    return f"{text}; 2 new requests queued: {queued_again}", took is not None and took < 1 and queued_again


def idle_flood(srv, count: int = 300):
    socks = []
    try:
        for _ in range(count):
            socks.append(srv.connect())
        time.sleep(0.5)
        start = time.monotonic()
        r = srv.post(CHAT, _chat(), timeout=30)
        took = time.monotonic() - start
        fds = srv.resources()
    finally:
        for s in socks:
            s.close()
    return f"{count} idle sockets; a request got {_status(r)} in {took:.2f} s; {fds}", r.status_code == 200


def slow_headers(srv):
    args = srv.args
    socks = [srv.connect() for _ in range(20)]
    for s in socks:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
    start = time.monotonic()
    closed = sum(_closed(s, args.read_timeout + 3) for s in socks)
    for s in socks:
        s.close()
    return f"{closed}/20 closed after {time.monotonic() - start:.1f} s", closed == 20


def slow_body(srv):
    s = srv.connect()
    with s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"pro")
        s.settimeout(30)
        head = s.recv(4096).split(b"\r\n", 1)[0].decode()
    return head, "408" in head


def request_timeout(srv):
    args = srv.args
    start = time.monotonic()
    r = srv.post(CHAT, _chat("long", max_tokens=LONG), timeout=args.request_timeout + 30)
    return f"{_status(r)} after {time.monotonic() - start:.1f} s", r.status_code == 504


def openapi_behind_key(srv):
    bare = httpx.get(f"{srv.url}/openapi.json", timeout=10, trust_env=False).status_code
    keyed = httpx.get(f"{srv.url}/openapi.json", headers=AUTH, timeout=10, trust_env=False).status_code
    return f"without key {bare}, with key {keyed}", (bare, keyed) == (401, 200)


# ---- issue 23: what a web page could send to the key-less server, and item 10's requests -------------------
CHAT_BODY = json.dumps(_chat()).encode()


def _refused(r: httpx.Response, status: int, code: str, param: str | None = None) -> tuple[str, bool]:
    try:
        err = r.json()["error"]
    except (ValueError, KeyError, TypeError):
        return f"{r.status_code} NOT AN ERROR OBJECT", False
    return (f"{r.status_code} {err['code']} param={err['param']}: {err['message'][:70]}",
            r.status_code == status and err["code"] == code and err["param"] == param)


def body_typed(content_type: str | None):
    """A chat body sent as a browser's simple (preflight-free) request would send it: 415."""
    def case(srv):
        headers = {} if content_type is None else {"content-type": content_type}
        return _refused(srv.request("POST", CHAT, headers, content=CHAT_BODY), 415, "unsupported_media_type")
    return case


def multipart_body(srv):
    r = srv.request("POST", CHAT, files={"body": ("body.json", CHAT_BODY, "application/json")})
    return _refused(r, 415, "unsupported_media_type")


def foreign_host(host: str):
    """What a DNS-rebinding page sends: its own name in Host, on a GET and on a POST: 421."""
    def case(srv):
        get = srv.request("GET", "/v1/models", {"Host": host})
        result, ok = _refused(srv.request("POST", CHAT, {"Host": host, "content-type": "application/json"},
                                          content=CHAT_BODY), 421, "invalid_host")
        return f"GET {get.status_code}; POST {result}", ok and get.status_code == 421
    return case


def loopback_hosts(srv):
    codes = {h: srv.request("POST", CHAT, {"Host": h, "content-type": "application/json"}, content=CHAT_BODY)
             .status_code for h in ("localhost", f"127.0.0.1:{srv.port}", "[::1]", "app.localhost")}
    return " ".join(f"{h} {c}" for h, c in codes.items()), set(codes.values()) == {200}


def cors_preflight(srv):
    origin = {"Origin": "http://evil.example"}
    pre = srv.request("OPTIONS", CHAT, {**origin, "Access-Control-Request-Method": "POST",
                                        "Access-Control-Request-Headers": "content-type"})
    post = srv.request("POST", CHAT, {**origin, "content-type": "application/json"}, content=CHAT_BODY)
    cors = [k for r in (pre, post) for k in r.headers if k.lower().startswith("access-control-")]
    return f"preflight {pre.status_code}, POST {post.status_code}, CORS headers {cors or 'none'}", not cors


def huge_int(srv):
    raw = CHAT_BODY[:-1] + b', "user": ' + b"9" * 5000 + b"}"
    return _refused(srv.post(CHAT, raw=raw), 400, "invalid_value", "user")


def refused_field(name: str, value, code: str):
    """A field that would change the answer and is not honoured: 400 naming it (it used to be ignored)."""
    return lambda srv: _refused(srv.post(CHAT, _chat(**{name: value})), 400, code, name)


def neutral_fields(srv):
    r = srv.post(CHAT, _chat(response_format={"type": "text"}, logit_bias={}, tool_choice="none",
                             function_call="auto"))
    return _status(r), r.status_code == 200


def head_health(srv):
    r = srv.request("HEAD", "/health")
    return f"{r.status_code}, {len(r.content)} body bytes", r.status_code == 200


def long_model_name(srv):
    r = srv.post(CHAT, _chat(model="m" * 100_000))
    result, ok = _refused(r, 404, "model_not_found", "model")
    size = len(r.json()["error"]["message"]) if ok else -1
    return f"{r.status_code}, message of {size} characters", ok and 0 < size < 200


# ---- issue 37 item 5: presence_penalty / frequency_penalty were accepted and did nothing ----------------------
def penalty_out_of_range(srv):
    return _refused(srv.post(CHAT, _chat(presence_penalty=2.5)), 400, "invalid_value", "presence_penalty")


def penalty_not_a_number(srv):
    return _refused(srv.post(CHAT, _chat(frequency_penalty="lots")), 400, "invalid_type", "frequency_penalty")


def penalties_applied(srv):
    """Zero is the same answer as absent; the largest penalties are served (200) and, on this gibberish model whose
    16-token answers repeat tokens, change the answer (they used to be ignored)."""
    def text(**extra):
        r = srv.post(CHAT, _chat("tell me", max_tokens=16, **extra))
        return r.status_code, r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else _status(r)

    plain, zero = text(), text(presence_penalty=0, frequency_penalty=0)
    pushed = text(presence_penalty=2, frequency_penalty=2)
    return (f"absent {plain[1][:20]!r}, zero {'same' if zero == plain else 'DIFFERENT'}, 2/2 {pushed[1][:20]!r}",
            plain[0] == zero[0] == pushed[0] == 200 and zero == plain and pushed != plain)


# ---- issue 35 item 5, on a server of its own: a lone request right after a burst waited the whole window -------
def lone_after_burst(model: str, args, wait_ms: int = 3000):
    """A burst of 8 concurrent requests, then a lone request, then another: the first lone one took 3.03 s at
    --batch-wait-ms 3000 (it waited for companions that were not coming); now it takes what the second takes."""
    srv = Server(model, args, key=None, extra=("--max-queue", "16", "--max-batch-size", "8",
                                               "--batch-wait-ms", str(wait_ms)))
    try:
        srv.wait_ready()
        barrier, codes = threading.Barrier(8), []

        def one():
            barrier.wait()
            codes.append(srv.post(CHAT, _chat(), timeout=60).status_code)

        threads = [threading.Thread(target=one) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        seconds = []
        for _ in range(2):
            start = time.monotonic()
            codes.append(srv.post(CHAT, _chat(), timeout=60).status_code)
            seconds.append(time.monotonic() - start)
    finally:
        srv.stop()
    return (f"burst {codes[:8].count(200)}/8 served; lone after it {seconds[0]:.2f} s, next lone {seconds[1]:.2f} s "
            f"(--batch-wait-ms {wait_ms})",
            codes == [200] * 10 and seconds[0] < seconds[1] + 1.0 and seconds[0] < wait_ms / 1000)


# ---- the tables: (label, case), each label starting with its issue item ----------------------------------------
KEYED_CASES = [  # issue 13 against a server with --api-key
    ("13.1 seed 2^64", seed_2_64), ("13.2 body 20 MB", body_20mb), ("13.2 prompt 1 MB", prompt_1mb),
    ("13.3 nested [ x100000", nested_json), ("13.3 prompt a\\ud800b", surrogate_prompt),
    ("13.3 model \\ud800", surrogate_model), ("13.3 temperature 1e-300", temperature_1e_300),
    ("13.4 non-streamed disconnect", non_streamed_disconnect), ("13.4 queued clients leave", queued_clients_leave),
    ("13.4 300 idle sockets", idle_flood), ("13.4 slow headers x20", slow_headers),
    ("13.4 slow body", slow_body), ("13.4 request timeout", request_timeout),
    ("13.5 control tokens in chat", control_tokens_in_chat), ("13.5 mask id in prompt", mask_id_prompt),
    ("13.5 /openapi.json", openapi_behind_key), ("23.4 text/plain with a key", body_typed("text/plain")),
]
WEB_CASES = [  # issue 23 (and 37.5) against the default server: loopback, no key
    ("23.4 text/plain body", body_typed("text/plain")),
    ("23.4 form-urlencoded body", body_typed("application/x-www-form-urlencoded")),
    ("23.4 multipart body", multipart_body), ("23.4 no Content-Type", body_typed(None)),
    ("23.4 Host evil.example", foreign_host("evil.example")),
    ("23.4 Host evil.example:port", foreign_host("evil.example:8000")),
    ("23.4 loopback Host names", loopback_hosts), ("23.4 CORS preflight", cors_preflight),
    ("23.10 user: 5000 digits", huge_int),
    ("23.10 response_format json", refused_field("response_format", {"type": "json_object"}, "unsupported_value")),
    ("23.10 logit_bias", refused_field("logit_bias", {"42": 100}, "unsupported_parameter")),
    ("23.10 tool_choice required", refused_field("tool_choice", "required", "unsupported_value")),
    ("23.10 function_call", refused_field("function_call", {"name": "f"}, "unsupported_value")),
    ("23.10 neutral values served", neutral_fields), ("23.10 HEAD /health", head_health),
    ("23.10 model name 100k chars", long_model_name),
    ("37.5 penalty out of range", penalty_out_of_range), ("37.5 penalty not a number", penalty_not_a_number),
    ("37.5 penalties applied", penalties_applied),
]
OWN_SERVER_CASES = [  # each starts (and stops) a server with its own flags: case(model, args)
    ("35.5 lone request after burst", lone_after_burst),
]


def run_cases(srv: Server, cases: list) -> bool:
    """Each case, then a normal request; one table row per case. True if every case and follow-up passed."""
    passed_all = True
    for name, case in cases:
        srv.slowest, srv.failures = 0.0, 0
        try:
            result, ok = case(srv)
        except Exception as err:  # a case that blows up is a failed case, not a crashed replay
            result, ok = f"{type(err).__name__}: {err}", False
        try:
            nxt = srv.post(CHAT, _chat(), timeout=60).status_code == 200 and srv.health()["status"] == "ok"
        except httpx.HTTPError:
            nxt = False
        health = f"{srv.slowest:.2f} s" + (f" ({srv.failures} failed)" if srv.failures else "")
        passed_all &= ok and nxt and not srv.failures
        print(row(name, ok, result, health, "ok" if nxt else "FAIL"), flush=True)
    return passed_all


def chosen(table: list, prefixes: list[str] | None) -> list:
    """The cases of ``table`` whose label starts with one of ``prefixes`` (all of them for None)."""
    return [(label, case) for label, case in table if prefixes is None or label.startswith(tuple(prefixes))]


def run_server_cases(model: str, args) -> bool:
    """The keyed server's cases, the key-less server's, then those that need a server of their own."""
    start, passed_all = time.monotonic(), True
    if not any(chosen(t, args.case) for t in (KEYED_CASES, WEB_CASES, OWN_SERVER_CASES)):
        return True
    for label, key, table in (("with --api-key", KEY, KEYED_CASES), ("default: no key", None, WEB_CASES)):
        cases = chosen(table, args.case)
        if not cases:
            continue
        srv = Server(model, args, key=key)
        try:
            srv.wait_ready()
            print(f"server ({label}) pid {srv.proc.pid} on {srv.url}; {srv.resources()}")
            passed_all &= run_cases(srv, cases)
            print(f"after all cases: {srv.resources()}; alive: {srv.proc.poll() is None}; "
                  f"{time.monotonic() - start:.0f} s so far\n")
        finally:
            srv.stop()
    for name, case in chosen(OWN_SERVER_CASES, args.case):
        try:
            result, ok = case(model, args)
        except Exception as err:
            result, ok = f"{type(err).__name__}: {err}", False
        passed_all &= ok
        print(row(name, ok, f"{result} (a server of its own)"), flush=True)
    print(f"{time.monotonic() - start:.0f} s so far\n")
    return passed_all


def main() -> int:
    p = argparse.ArgumentParser(description="replay hostile requests against oled-moe serve (loopback), then "
                                            "hostile command lines and Python calls (eval/attack_cli.py)")
    p.add_argument("--only", choices=("server", "cli"), default=None, help="run only one half (default: both)")
    p.add_argument("--case", action="append", metavar="PREFIX", default=None,
                   help="run only the cases whose label starts with PREFIX ('35.8', '13.5 blank'); repeatable")
    p.add_argument("--model", default=None, help="checkpoint (default: a fresh tiny one in a temporary folder)")
    p.add_argument("--read-timeout", type=float, default=2.0, help="the server's --read-timeout (default: 2)")
    p.add_argument("--request-timeout", type=float, default=3.0, help="the server's --request-timeout (default: 3)")
    p.add_argument("--max-body-bytes", type=int, default=1 << 21, help="the server's --max-body-bytes (default: 2 MiB)")
    args = p.parse_args()
    tables = {"server": (KEYED_CASES, WEB_CASES, OWN_SERVER_CASES), "cli": (attack_cli.CASES,)}
    halves = [h for h in tables if args.only in (None, h)]
    if args.case and not any(chosen(t, args.case) for h in halves for t in tables[h]):
        p.error(f"--case {' '.join(args.case)}: no case label starts with that (e.g. '35.8', '13.5 blank')")

    scratch = None
    model = args.model
    if model is None:
        from oled_hf.checkpoints.factory import make_checkpoint

        scratch = tempfile.TemporaryDirectory()
        model = str(make_checkpoint(Path(scratch.name) / "tiny", preset="tiny", seed=0))
    start, passed_all = time.monotonic(), True
    print(f"{'case':{WIDTH}} {'pass':4}  {'/health max':>11}  {'next':4}  result")
    try:
        if args.only in (None, "server"):
            passed_all &= run_server_cases(model, args)
        if args.only in (None, "cli"):
            print("command lines and Python calls (eval/attack_cli.py), each in a fresh interpreter")
            passed_all &= attack_cli.run_cases(model, chosen(attack_cli.CASES, args.case))
    finally:
        if scratch is not None:
            scratch.cleanup()
    print(f"{time.monotonic() - start:.0f} s in all; " + ("ALL PASSED" if passed_all else "SOME CASES FAILED"))
    return 0 if passed_all else 1


if __name__ == "__main__":
    sys.exit(main())
