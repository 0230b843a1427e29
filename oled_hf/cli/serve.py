"""``oled-moe serve``: an OpenAI-compatible HTTP server (chat and text completions, SSE streaming)."""

from __future__ import annotations

import argparse
import os
import sys

from ..options.budget import budget_choices, check_budget_device
from ..serve.options import (
    add_serving_model_arguments,
    add_system_argument,
    loading_problem,
    max_model_len_problem,
    model_argument,
)
from .common import add_command, resolve_device, resolve_model, served_model_name, standalone

API_KEY_ENV = "OLED_MOE_API_KEY"


HELP = "serve one model over an OpenAI-compatible HTTP API (streams block by block)"


def register(sub: argparse._SubParsersAction) -> None:
    add_command(sub, "serve", HELP, configure)


def configure(p: argparse.ArgumentParser) -> None:
    from ..serve.batching import DEFAULT_BATCH_WAIT_MS, DEFAULT_MAX_BATCH_SIZE

    add_serving_model_arguments(p)
    add_system_argument(p)
    p.add_argument("--served-model-name", default=None,
                   help="model name clients use (default: the config's oled_model_name, else the folder name)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="TCP port to listen on (0: any free port)")
    p.add_argument("--default-max-tokens", type=int, default=256,
                   help="completion length when a request gives no max_tokens")
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                   help=f"require 'Authorization: Bearer KEY' on /v1 and /metrics (default: ${API_KEY_ENV})")
    p.add_argument("--max-queue", type=int, default=16,
                   help="requests allowed to wait for the model; more are answered 429 at once")
    p.add_argument("--max-batch-size", "--max-num-seqs", type=int, default=DEFAULT_MAX_BATCH_SIZE,
                   help="most requests decoded together in one generate (1: one at a time); --max-num-seqs is "
                        "vLLM's name for it")
    p.add_argument("--batch-wait-ms", type=float, default=DEFAULT_BATCH_WAIT_MS,
                   help="how long the oldest waiting request waits for others to share its batch, in milliseconds")
    p.add_argument("--insecure", action="store_true",
                   help="allow a non-loopback --host without --api-key")
    p.add_argument("--allowed-hosts", type=split_hosts, default=[], metavar="NAMES",
                   help="comma-separated extra names accepted in the Host header, e.g. 'gpu.lan,.example.com' "
                        "('.example.com': that domain and its subdomains; '*': any). By default only localhost, "
                        "*.localhost, loopback addresses and --host itself are, which stops DNS-rebinding pages; "
                        "a keyed server on a public --host checks Host only when this is given")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level")
    add_limit_arguments(p)
    p.set_defaults(func=serve)


def add_limit_arguments(p: argparse.ArgumentParser) -> None:
    """The bounds that keep one client from stalling the server (oled_hf.serve.guard.Limits)."""
    from ..serve.guard import Limits

    d = Limits()
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes,
                   help=f"largest request body accepted; larger ones get 413 (default: {d.max_body_bytes})")
    p.add_argument("--request-timeout", type=float, default=d.request_timeout,
                   help="seconds one request may spend generating before it is stopped with a 504; 0 for no limit "
                        f"(default: {d.request_timeout:g})")
    p.add_argument("--read-timeout", type=float, default=d.read_timeout,
                   help="seconds a client may take to send a request's headers, and then its body; slower "
                        f"connections are closed (headers) or answered 408 (body) (default: {d.read_timeout:g})")
    p.add_argument("--keep-alive-timeout", type=float, default=d.keep_alive,
                   help="seconds an idle keep-alive connection stays open after a response "
                        f"(default: {d.keep_alive:g})")
    p.add_argument("--max-header-bytes", type=int, default=d.max_header_bytes,
                   help="most bytes of an unfinished request head (request line and headers) buffered; past it "
                        f"uvicorn answers 400 and closes (h11's limit) (default: {d.max_header_bytes})")
    p.add_argument("--max-connections", type=int, default=d.max_connections,
                   help="open connections kept; past it a new connection closes the oldest idle one, and beyond "
                        f"16 more with requests running uvicorn answers 503 (default: {d.max_connections})")


def limits_from(args: argparse.Namespace):
    from ..serve.guard import Limits

    return Limits(max_body_bytes=args.max_body_bytes, read_timeout=args.read_timeout,
                  keep_alive=args.keep_alive_timeout, max_connections=args.max_connections,
                  request_timeout=args.request_timeout or None, max_header_bytes=args.max_header_bytes)


def split_hosts(value: str) -> list[str]:
    """``--allowed-hosts a,b`` -> ``["a", "b"]`` (blank entries dropped)."""
    return [name.strip() for name in value.split(",") if name.strip()]


def check_options(args: argparse.Namespace) -> str | None:
    """Why these options must not start a server, or None."""
    from ..serve.batching import batching_problem
    from ..serve.guard import allowed_hosts_problem, api_key_problem, is_loopback

    key_problem = api_key_problem(args.api_key)
    if key_problem:
        return f"{key_problem} (it may come from ${API_KEY_ENV})"
    hosts_problem = allowed_hosts_problem(args.allowed_hosts)
    if hosts_problem:
        return hosts_problem
    if not is_loopback(args.host) and not args.api_key and not args.insecure:
        return (f"refusing to listen on {args.host} without --api-key: anyone who can reach this address could "
                "use the model. Pass --api-key KEY (clients then send 'Authorization: Bearer KEY'), bind to "
                "127.0.0.1, or add --insecure to serve without authentication anyway.")
    if not 0 <= args.port <= 65535:
        return f"--port {args.port} is invalid: must be in 0..65535"
    if args.max_queue < 1:
        return f"--max-queue {args.max_queue} is invalid: must be at least 1"
    problem = batching_problem(args.max_batch_size, args.batch_wait_ms) or loading_problem(args)
    if problem:
        return problem
    if args.default_max_tokens < 1:
        return f"--default-max-tokens {args.default_max_tokens} is invalid: must be at least 1"
    if args.block_length is not None and args.block_length < 1:
        return f"--block-length {args.block_length} is invalid: must be at least 1"
    if args.threshold is not None and not 0.0 <= args.threshold <= 1.0:
        return f"--threshold {args.threshold} is invalid: must be between 0 and 1"
    if args.request_timeout is not None and args.request_timeout < 0:
        return f"--request-timeout {args.request_timeout:g} is invalid: must be 0 (no limit) or more seconds"
    problems = limits_from(args).problems()
    return problems[0] if problems else None


def insecure_warning(args: argparse.Namespace) -> str | None:
    """A loud banner when --insecure really exposes the model (a non-loopback host, no key)."""
    from ..serve.guard import is_loopback

    if not args.insecure or args.api_key or is_loopback(args.host):
        return None
    line = "!" * 78
    return (f"{line}\nWARNING: serving on {args.host}:{args.port} WITHOUT AUTHENTICATION (--insecure).\n"
            "Anyone who can reach this address can run the model, read /metrics and fill the queue.\n"
            "Use --api-key KEY (or $OLED_MOE_API_KEY), or bind to 127.0.0.1.\n"
            f"{line}")


def serve(args: argparse.Namespace) -> int:
    problem = check_options(args)
    if problem:
        print(f"oled-moe serve: error: {problem}", file=sys.stderr)
        return 2
    try:
        import uvicorn

        from ..serve.app import create_app
    except ImportError as err:
        print(f"oled-moe serve: error: {err.name} is missing; install the server extras: "
              "pip install 'oled-hf[serve]'", file=sys.stderr)
        return 2
    from pathlib import Path

    from ..serve.engine import Engine, load_model

    path = str(resolve_model(model_argument(args)))
    problem = max_model_len_problem(Path(path), args.max_model_len)
    if problem:
        print(f"oled-moe serve: error: {problem}", file=sys.stderr)
        return 2
    name = args.served_model_name or served_model_name(Path(path))
    device = resolve_device(args.device)  # a --device this machine lacks: one line, before anything loads
    budgets = budget_choices(args)
    check_budget_device(budgets, device)
    model, tokenizer = load_model(path, device=device, budget=budgets[0] if budgets else None,
                                  dtype=args.dtype, system=args.system)
    limits = limits_from(args)
    engine = Engine(model, tokenizer, max_queue=args.max_queue, default_max_tokens=args.default_max_tokens,
                    block_length=args.block_length, threshold=args.threshold, request_timeout=limits.request_timeout,
                    max_batch_size=args.max_batch_size, batch_wait_ms=args.batch_wait_ms,
                    max_model_len=args.max_model_len)
    app = create_app(engine, name, api_key=args.api_key, limits=limits, host=args.host,
                     allowed_hosts=args.allowed_hosts)
    warning = insecure_warning(args)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    offload = "on" if budgets else "off"
    print(f"oled-moe serve: model '{name}' from {path} on {model.device} (offloading {offload}; batches of up to "
          f"{engine.max_batch_size}, {engine.context_length} tokens per request); "
          f"OpenAI API at http://{args.host}:{args.port}/v1"
          f"{' (API key required)' if args.api_key else ''}", file=sys.stderr, flush=True)
    try:
        # open streams get a few seconds to finish on Ctrl-C; then they are cut (and their generation aborted)
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5,
                    **limits.uvicorn_options())
    finally:
        engine.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run ``serve`` on its own (``python -m oled_hf.cli.serve --model ./tiny``), as ``oled-moe serve`` would."""
    return standalone("serve", configure, HELP, argv)


if __name__ == "__main__":
    sys.exit(main())
