"""Batched-serving benchmark: throughput and p50/p95 latency at 1, 4 and 8 concurrent clients.

For each mode (``resident``: every expert on the device; ``offloaded``: ``--cache-ratio 0.4``) an
``oled-moe serve`` process runs on a free loopback port; closed-loop clients (threads of this
process, each sending its next request when its last one is answered) post greedy chat completions
of the toy's 3-digit additions. The first pass, one client, answers every question alone (a batch of one): those are the
single-request answers every later pass must reproduce, answer for answer. Loopback only, bounded by
``--requests`` per pass and a per-request ``--timeout``.

    .venv/bin/python eval/serve_bench.py                      # the toy, resident and offloaded, ~1 min on CPU
    .venv/bin/python eval/serve_bench.py --modes resident --clients 1 8 --json
    .venv/bin/python eval/serve_bench.py --client openai      # the official openai client instead

``--client http`` (default) posts with ``http.client`` (light: the clients take little CPU from the
server); ``--client openai`` with the ``openai`` package (``OpenAI(...).chat.completions.create``,
one client object per thread), as an application would. Each row also gives the CPU seconds per
request of this process (the clients) and of the server, so a limit set by the clients' own CPU
cost on a small machine shows, and the batches by size (the server's ``oled_batch_size`` buckets:
``4:3`` is three batches of 4; ``6:`` holds 5 and 6).

``--server NAME=CHECKOUT`` (repeatable) runs each server from that checkout's code, all of them up
at once and their passes interleaved round by round, so that two versions are compared under the
same load (``git worktree add /tmp/old HEAD~1`` makes an old one):

    .venv/bin/python eval/serve_bench.py --server old=/tmp/old --server new=. --clients 1 8 --client openai

``--batch-wait-ms`` is passed to every server when given; by default each uses its own default.

Exit status 1 when an answer differs from its single-request answer or a request fails.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

MODES = ("resident", "offloaded")
CACHE_RATIO = 0.4
MAX_REQUESTS = 1024
STARTUP_S = 300  # a loaded 2-core machine took 42 s to load the toy and answer /health
CHECKOUT = Path(__file__).resolve().parents[1]  # the server runs this checkout's code unless --server says another


def _questions(count: int) -> list[str]:
    """The first ``count`` questions of the toy's test split (it ships next to the toy checkpoint)."""
    import oled_hf.toy

    path = Path(oled_hf.toy.__file__).parent / "jsonl" / "test.jsonl"
    with path.open() as f:
        return [json.loads(line)["question"] for _, line in zip(range(count), f)]


class _Server:
    """``oled-moe serve`` in its own process on a free loopback port (the clients' threads share no GIL with it)."""

    def __init__(self, args, mode: str, checkout: Path = CHECKOUT):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        wait = [] if args.batch_wait_ms is None else ["--batch-wait-ms", str(args.batch_wait_ms)]
        command = [sys.executable, "-m", "oled_hf.cli.serve", *([args.model] if args.model else []), "--port",
                   str(self.port), "--device", args.device, "--max-batch-size", str(args.max_batch_size),
                   *wait, "--max-queue", str(max(16, 2 * max(args.clients))),
                   "--log-level", "warning", *(["--cache-ratio", str(CACHE_RATIO)] if mode == "offloaded" else [])]
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false",
               "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
        # run from the checkout: ``-m`` puts it first on sys.path, before the editable install
        self.proc = subprocess.Popen(command, env=env, cwd=checkout, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)

    def __enter__(self) -> _Server:
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited: {self.proc.communicate()[1][-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", trust_env=False, timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.1)
        self.__exit__()
        raise RuntimeError(f"the server did not answer /health within {STARTUP_S} s")

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.communicate()


class _Client:
    """One keep-alive connection (``http.client``: light, so the clients take little CPU from the server)."""

    def __init__(self, url: str, timeout: float):
        host, port = url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=timeout)

    def post(self, path: str, body: dict) -> dict:
        self.conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = self.conn.getresponse()
        data = r.read()
        if r.status != 200:
            raise RuntimeError(f"request failed: {r.status} {data[:200]!r}")
        return json.loads(data)

    def get(self, path: str) -> str:
        self.conn.request("GET", path)
        return self.conn.getresponse().read().decode()


class _OpenAIClient:
    """The official ``openai`` client (``pip install openai``), one per thread as applications use it."""

    def __init__(self, url: str, timeout: float):
        import openai

        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", timeout=timeout, max_retries=0)
        self.model = self.client.models.list().data[0].id  # the served name, once, before the timed requests

    def chat(self, body: dict) -> tuple[str, int]:
        out = self.client.chat.completions.create(model=self.model, **body)
        return out.choices[0].message.content, int(out.usage.completion_tokens)


def _make_client(url: str, args):
    return _OpenAIClient(url, args.timeout) if args.client == "openai" else _Client(url, args.timeout)


def _ask(client, question: str, args) -> tuple[str, float, int]:
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": args.max_tokens}
    start = time.perf_counter()
    if isinstance(client, _OpenAIClient):
        text, tokens = client.chat(body)
    else:
        out = client.post("/v1/chat/completions", body)
        text, tokens = out["choices"][0]["message"]["content"], int(out["usage"]["completion_tokens"])
    return text, time.perf_counter() - start, tokens


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc; 0 where it is not readable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def _batch_sizes(text: str) -> dict[str, float]:
    """The ``oled_batch_size`` histogram's cumulative bucket counts by upper bound (``le``), from /metrics."""
    counts = {}
    for line in text.splitlines():
        if line.startswith('oled_batch_size_bucket{le="'):
            counts[line.split('"')[1]] = float(line.split()[-1])
    return counts


def batch_histogram(before: dict[str, float], after: dict[str, float], largest: int) -> dict[str, int]:
    """Batches per size bucket in a pass (the histogram's buckets: "1", "2", "3", "4", "6", "8"...; a bucket
    holds the sizes above the previous bound), up to the bucket that holds ``largest``."""
    out, below = {}, 0.0
    for le in after:
        if le == "+Inf":
            break
        total = after[le] - before.get(le, 0.0)
        out[le.removesuffix(".0")] = int(total - below)
        below = total
        if float(le) >= largest:
            break
    return out


def _pass(url: str, questions: list[str], clients: int, args, server_pid: int = 0) -> dict:
    """``clients`` closed-loop clients share ``questions``; answers come back in question order."""
    answers: list = [None] * len(questions)
    latencies: list = [None] * len(questions)
    tokens = [0] * len(questions)
    next_index = iter(range(len(questions)))
    lock = threading.Lock()

    made = threading.Barrier(clients + 1)

    def client_loop() -> None:
        client = _make_client(url, args)
        made.wait()
        while True:
            with lock:
                i = next(next_index, None)
            if i is None:
                return
            answers[i], latencies[i], tokens[i] = _ask(client, questions[i], args)

    before = _Client(url, args.timeout).get("/metrics")
    with ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(client_loop) for _ in range(clients)]
        made.wait(60)  # the clients exist (the openai package's setup is not timed)
        start, cpu, server_cpu = time.perf_counter(), time.process_time(), _cpu_seconds(server_pid)
        for future in futures:
            future.result()
        wall = time.perf_counter() - start
        cpu, server_cpu = time.process_time() - cpu, _cpu_seconds(server_pid) - server_cpu
    after = _Client(url, args.timeout).get("/metrics")
    batches = _metric(after, "oled_batches_total") - _metric(before, "oled_batches_total")
    ordered = sorted(latencies)
    return {
        "clients": clients, "requests": len(questions), "wall_s": wall,
        "tokens_per_s": sum(tokens) / wall, "requests_per_s": len(questions) / wall,
        "p50_s": statistics.median(ordered), "p95_s": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
        "mean_batch": len(questions) / batches if batches else None, "answers": answers, "latencies": ordered,
        "batch_sizes": batch_histogram(_batch_sizes(before), _batch_sizes(after), args.max_batch_size),
        "client_cpu_ms": 1e3 * cpu / len(questions), "server_cpu_ms": 1e3 * server_cpu / len(questions),
    }


def bench_mode(mode: str, questions: list[str], args) -> list[dict]:
    """Every server and client count, ``--rounds`` times interleaved (load from elsewhere hits them alike;
    the servers' order alternates by round); per server and client count the median round's throughput,
    latencies pooled over the rounds, and the speed-up over one client (median and range of the rounds'
    own ratios, each over the same round's one-client pass)."""
    servers = args.server or [("this", CHECKOUT)]
    runs: dict[tuple[str, int], list[dict]] = {(name, c): [] for name, _ in servers for c in args.clients}
    with contextlib.ExitStack() as stack:
        started = [(name, _Server(args, mode, checkout)) for name, checkout in servers]  # they load in parallel
        live = [(name, stack.enter_context(server)) for name, server in started]
        for _, server in live:
            _pass(server.url, questions[: min(8, len(questions))], 1, args)  # warm-up, untimed
        for round_index in range(args.rounds):
            for clients in args.clients:
                for name, server in live if round_index % 2 == 0 else live[::-1]:
                    runs[name, clients].append(_pass(server.url, questions, clients, args, server.proc.pid))
    single = runs[servers[0][0], 1][0]["answers"] if 1 in args.clients else None
    rows = []
    for (name, _clients), passes in runs.items():
        by_speed = sorted(passes, key=lambda r: r["tokens_per_s"])
        row = dict(by_speed[len(by_speed) // 2])
        pooled = sorted(t for r in passes for t in r["latencies"])
        ratios = sorted(r["tokens_per_s"] / one["tokens_per_s"] for r, one in zip(passes, runs[name, 1])) \
            if 1 in args.clients else []
        sizes: dict[str, int] = {}
        for r in passes:
            for le, n in r["batch_sizes"].items():
                sizes[le] = sizes.get(le, 0) + n
        row.update(mode=mode, server=name, rounds=len(passes), p50_s=statistics.median(pooled),
                   p95_s=pooled[min(len(pooled) - 1, int(0.95 * len(pooled)))],
                   tokens_per_s_range=[by_speed[0]["tokens_per_s"], by_speed[-1]["tokens_per_s"]],
                   mean_batch=statistics.mean(r["mean_batch"] or 0 for r in passes), batch_sizes=sizes,
                   identical=None if single is None else all(r["answers"] == single for r in passes),
                   speedup=statistics.median(ratios) if ratios else None,
                   speedup_range=[ratios[0], ratios[-1]] if ratios else None)
        row.pop("answers")
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    head = (f"{'mode':<10}{'server':<8}{'clients':>8}{'req':>6}{'tok/s':>9}{'(range)':>14}{'req/s':>8}{'x1':>6}"
            f"{'(range)':>13}{'p50 ms':>9}{'p95 ms':>9}{'batch':>7}{'cli cpu':>9}{'srv cpu':>9}  identical"
            "  batches by size")
    lines = [head]
    for r in rows:
        batch = f"{r['mean_batch']:.1f}" if r["mean_batch"] else "-"
        speedup = f"{r['speedup']:.2f}" if r["speedup"] else "-"
        spread = f"({r['speedup_range'][0]:.2f}-{r['speedup_range'][1]:.2f})" if r["speedup_range"] else "-"
        same = {True: "yes", False: "NO", None: "-"}[r["identical"]]
        low, high = r["tokens_per_s_range"]
        sizes = " ".join(f"{le}:{n}" for le, n in r["batch_sizes"].items())
        lines.append(f"{r['mode']:<10}{r['server']:<8}{r['clients']:>8}{r['requests']:>6}{r['tokens_per_s']:>9.1f}"
                     f"{f'({low:.0f}-{high:.0f})':>14}{r['requests_per_s']:>8.1f}{speedup:>6}{spread:>13}"
                     f"{r['p50_s'] * 1e3:>9.1f}{r['p95_s'] * 1e3:>9.1f}"
                     f"{batch:>7}{r['client_cpu_ms']:>9.1f}{r['server_cpu_ms']:>9.1f}  {same:<9}  {sizes}")
    return "\n".join(lines)


def server_choice(text: str) -> tuple[str, Path]:
    """``--server NAME=CHECKOUT``: a name for the table and a checkout whose ``oled_hf`` that server runs."""
    name, found, folder = text.partition("=")
    path = Path(folder).expanduser().resolve()
    if not found or not name or not (path / "oled_hf" / "cli" / "serve.py").is_file():
        raise argparse.ArgumentTypeError(f"--server {text!r} is invalid: must be NAME=CHECKOUT, a folder holding "
                                         "oled_hf/cli/serve.py (for example old=/tmp/old-checkout)")
    return name, path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="checkpoint folder (default: the shipped 3-digit toy)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--clients", nargs="+", type=int, default=[1, 4, 8],
                   help="concurrent clients per pass; the first should be 1 (the single-request answers)")
    p.add_argument("--requests", type=int, default=64, help=f"requests per pass (at most {MAX_REQUESTS})")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--batch-wait-ms", type=float, default=None,
                   help="passed to every server (default: not passed, each server uses its own default)")
    p.add_argument("--server", action="append", type=server_choice, metavar="NAME=CHECKOUT",
                   help="a server to run from CHECKOUT's code (repeat to compare checkouts, interleaved round by "
                        "round; default: this checkout)")
    p.add_argument("--threads", type=int, default=1, help="the server's torch CPU threads (OMP_NUM_THREADS)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds one request may take")
    p.add_argument("--rounds", type=int, default=3, help="passes per client count (the median is shown)")
    p.add_argument("--client", choices=("http", "openai"), default="http",
                   help="http: http.client (light); openai: the official openai package (default: http)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = p.parse_args(argv)
    if not 1 <= args.requests <= MAX_REQUESTS:
        p.error(f"--requests {args.requests} is invalid: must be in 1..{MAX_REQUESTS}")
    if any(c < 1 for c in args.clients):
        p.error("--clients must all be at least 1")
    names = [name for name, _ in args.server or []]
    if len(set(names)) < len(names):
        p.error(f"--server names must differ: {', '.join(names)}")
    if not 1 <= args.rounds <= 20:
        p.error(f"--rounds {args.rounds} is invalid: must be in 1..20")

    questions = _questions(args.requests)
    rows = [row for mode in args.modes for row in bench_mode(mode, questions, args)]
    if args.json:
        print(json.dumps([{k: v for k, v in r.items() if k != "latencies"} for r in rows], indent=2))
    else:
        wait = "each server's default" if args.batch_wait_ms is None else f"{args.batch_wait_ms:g} ms"
        print(f"{args.requests} greedy chat requests per pass, {args.rounds} rounds (median shown), "
              f"max_tokens {args.max_tokens}, max batch "
              f"{args.max_batch_size}, batch wait {wait}, {args.threads} torch thread(s), "
              f"device {args.device}, {args.client} client; offloaded = cache_ratio {CACHE_RATIO}; cli/srv cpu: CPU ms "
              "per request of the clients' process and the server's")
        print(table(rows))
    ok = all(r["identical"] is not False for r in rows)
    if not ok:
        print("some answers differ from their single-request answers", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
