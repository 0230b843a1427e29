"""Loopback load test for ``oled-moe serve``: N chat requests, C at a time, bounded in time.

Against a running server (``--url http://127.0.0.1:8000``) or, by default, an in-process one on a
free loopback port serving ``--model`` (a tiny random-weight checkpoint is made in a temporary
folder when no model is given). Prints completed, rejected (429), failed, median and p95 latency.

    .venv/bin/python eval/load_test.py --requests 50 --concurrency 4 --max-tokens 16
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx


def _in_process_server(args):
    """Start uvicorn on a pre-bound loopback socket in a thread; return (url, stop)."""
    import torch
    import uvicorn

    from oled_hf.serve.app import create_app
    from oled_hf.serve.engine import Engine, load_model

    torch.set_num_threads(args.threads)
    model_path, scratch = args.model, None
    if model_path is None:
        from oled_hf.checkpoints.factory import make_checkpoint

        scratch = tempfile.TemporaryDirectory()
        model_path = str(make_checkpoint(os.path.join(scratch.name, "tiny"), preset="tiny", seed=0))
    model, tokenizer = load_model(model_path, device=args.device)
    wait = {} if args.batch_wait_ms is None else {"batch_wait_ms": args.batch_wait_ms}
    engine = Engine(model, tokenizer, max_queue=args.max_queue, block_length=args.block_length,
                    max_batch_size=args.max_batch_size, **wait)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # asyncio then sets TCP_NODELAY
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(engine, "load-test"), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", trust_env=False).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.05)

    def stop():
        server.should_exit = True
        thread.join(10)
        engine.stop()
        if scratch is not None:
            scratch.cleanup()

    return url, stop


def _one(client: httpx.Client, i: int, args, deadline: float) -> tuple[str, float, int]:
    if time.monotonic() > deadline:
        return "skipped", 0.0, 0
    body = {"messages": [{"role": "user", "content": f"request {i}: tell me something"}],
            "max_tokens": args.max_tokens, "block_length": args.block_length, "stream": args.stream}
    start = time.perf_counter()
    try:
        if args.stream:
            with client.stream("POST", "/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    r.read()
                    return ("rejected" if r.status_code == 429 else "failed"), time.perf_counter() - start, 0
                lines = [line for line in r.iter_lines() if line.startswith("data: ")]
                ok = lines and lines[-1] == "data: [DONE]"
                return ("completed" if ok else "failed"), time.perf_counter() - start, 0
        r = client.post("/v1/chat/completions", json=body)
    except httpx.HTTPError:
        return "failed", time.perf_counter() - start, 0
    elapsed = time.perf_counter() - start
    if r.status_code == 429:
        return "rejected", elapsed, 0
    if r.status_code != 200:
        return "failed", elapsed, 0
    return "completed", elapsed, int(r.json()["usage"]["completion_tokens"])


def main() -> int:
    p = argparse.ArgumentParser(description="loopback load test for oled-moe serve")
    p.add_argument("--url", default=None, help="a running server; default: start one in this process")
    p.add_argument("--model", default=None, help="checkpoint for the in-process server (default: a fresh tiny one)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-queue", type=int, default=16)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the in-process server")
    p.add_argument("--max-batch-size", type=int, default=8, help="in-process server: requests per generate")
    p.add_argument("--batch-wait-ms", type=float, default=None,
                   help="in-process server: batching window (default: the engine's)")
    p.add_argument("--requests", type=int, default=50)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--block-length", type=int, default=8)
    p.add_argument("--stream", action="store_true", help="stream the answers (SSE)")
    p.add_argument("--time-limit", type=float, default=120.0, help="stop sending new requests after this")
    args = p.parse_args()

    url, stop = (args.url, lambda: None) if args.url else _in_process_server(args)
    deadline = time.monotonic() + args.time_limit
    start = time.perf_counter()
    with httpx.Client(base_url=url, timeout=args.time_limit, trust_env=False) as client, \
            ThreadPoolExecutor(args.concurrency) as pool:
        results = list(pool.map(lambda i: _one(client, i, args, deadline), range(args.requests)))
    wall = time.perf_counter() - start
    stop()
    latencies = sorted(t for outcome, t, _ in results if outcome == "completed")
    counts = {k: sum(r[0] == k for r in results) for k in ("completed", "rejected", "failed", "skipped")}
    summary = {
        **counts, "concurrency": args.concurrency, "max_tokens": args.max_tokens, "wall_s": round(wall, 2),
        "median_latency_s": round(statistics.median(latencies), 4) if latencies else None,
        "p95_latency_s": round(latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))], 4)
        if latencies else None,
        "completion_tokens_per_s": round(sum(r[2] for r in results) / wall, 1) if not args.stream else None,
    }
    print(json.dumps(summary, indent=2))
    return 0 if counts["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
