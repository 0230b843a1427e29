"""The OpenAI-compatible HTTP API: ``create_app(engine, served_model_name, api_key=None)``.

Handlers validate and tokenize on the event loop, then hand the request to the engine's worker
and wait for its events on an asyncio queue. A streamed answer starts only once decoding has
begun, so anything ``generate`` refuses still gets a plain 400; after that the client receives one
SSE chunk per completed diffusion block. A client that leaves (while queued or mid-stream) sets
the request's ``cancelled`` flag, which frees the worker at the next block boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .engine import Engine, GenerationRequest, QueueFull
from .metrics import offload_figures
from .protocol import APIError, GenerationOptions, parse_chat, parse_completion, parse_json, resolve_max_tokens

POLL_SECONDS = 0.2  # how often a waiting, non-streaming handler checks that its client is still there


def _error_response(err: APIError) -> JSONResponse:
    headers = {"Retry-After": "1"} if err.status == 429 else None
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


class _CountRequests:
    """Pure ASGI middleware (it must not buffer streams): counts requests by endpoint and status."""

    def __init__(self, app, metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = 500

        async def send_and_note(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            self.metrics.count_request(scope["path"], status)


def create_app(engine: Engine, served_model_name: str, api_key: str | None = None) -> FastAPI:
    created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        yield

    app = FastAPI(title="oled-hf", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.add_middleware(_CountRequests, metrics=engine.metrics)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, err: APIError):
        return _error_response(err)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code)
        return _error_response(APIError(err.status_code, f"{request.method} {request.url.path}: {err.detail}",
                                        code=code))

    def authorize(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            raise APIError(401, "missing or incorrect API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key")

    def check_model(name: str | None) -> None:
        if name is not None and name != served_model_name:
            raise APIError(404, f"the model '{name}' does not exist; this server serves '{served_model_name}'",
                           param="model", code="model_not_found")

    def model_card() -> dict[str, Any]:
        return {"id": served_model_name, "object": "model", "created": created, "owned_by": "oled-hf"}

    @app.get("/health")
    async def health():
        body = {"status": "ok" if engine.alive else "stopped", "model": served_model_name,
                "queue_depth": engine.queue_depth, "running": engine.running}
        return JSONResponse(body, status_code=200 if engine.alive else 503)

    @app.get("/metrics")
    async def metrics(request: Request):
        authorize(request)
        text = engine.metrics.render(engine.queue_depth, engine.running, offload_figures(engine.model))
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def list_models(request: Request):
        authorize(request)
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    async def get_model(name: str, request: Request):
        authorize(request)
        check_model(name)
        return model_card()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        authorize(request)
        req = parse_chat(parse_json(await request.body()))
        check_model(req.model)
        try:
            input_ids = engine.encode_chat(req.messages)
        except Exception as err:  # the chat template refused the conversation
            raise APIError(400, f"the chat template could not render 'messages': {err}", param="messages") from None
        return await _generate(request, req, input_ids, "messages", chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        authorize(request)
        req = parse_completion(parse_json(await request.body()))
        check_model(req.model)
        if isinstance(req.prompt, list):
            vocab = int(engine.model.config.vocab_size)
            if any(not 0 <= t < vocab for t in req.prompt):
                raise APIError(400, f"'prompt' token ids must be in [0, {vocab})", param="prompt",
                               code="invalid_value")
            input_ids = torch.tensor([req.prompt], dtype=torch.long)
        else:
            input_ids = engine.encode_text(req.prompt)
        return await _generate(request, req, input_ids, "prompt", chat=False)

    async def _generate(request: Request, req: GenerationOptions, input_ids, prompt_param: str, chat: bool):
        block = req.block_length or engine.block_length
        if block > engine.context_length:
            raise APIError(400, f"'block_length' is {block}, longer than the model's context of "
                                f"{engine.context_length} tokens", param="block_length", code="invalid_value")
        max_tokens = resolve_max_tokens(int(input_ids.shape[1]), req.max_tokens, engine.default_max_tokens, block,
                                        engine.context_length, prompt_param)
        loop, events = asyncio.get_running_loop(), asyncio.Queue()

        def emit(event: tuple) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
                loop.call_soon_threadsafe(events.put_nowait, event)

        job = GenerationRequest(input_ids=input_ids, max_tokens=max_tokens, emit=emit, stop=req.stop,
                                temperature=req.temperature, top_p=req.top_p, seed=req.seed,
                                block_length=req.block_length, threshold=req.threshold)
        try:
            engine.submit(job)
        except QueueFull as err:
            raise APIError(429, str(err), code="queue_full", type="rate_limit_error") from None
        except ValueError as err:
            raise APIError(400, str(err)) from None
        try:
            first = await _next_event(request, events, job)
            if first[0] == "error":
                _raise_event_error(first)
            ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
            shape = _Shape(ident, served_model_name, chat)
            if req.stream:
                return _JobStream(job, _sse(shape, first, events, job, req.include_usage))
            pieces = []
            while (event := await _next_event(request, events, job))[0] == "delta":
                pieces.append(event[1])
            if event[0] == "error":
                _raise_event_error(event)
            return shape.whole("".join(pieces), event[1], event[2])
        except BaseException:
            job.cancelled.set()
            raise

    return app


async def _next_event(request: Request, events: asyncio.Queue, job: GenerationRequest) -> tuple:
    """The worker's next event; a client that has left cancels the job (only before a response has started)."""
    while True:
        try:
            return await asyncio.wait_for(events.get(), POLL_SECONDS)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                job.cancelled.set()
                raise APIError(499, "the client closed the request", code="client_closed_request") from None


class _JobStream(StreamingResponse):
    """An SSE response that cancels its job however it ends (finished, client gone, server stopping)."""

    def __init__(self, job: GenerationRequest, content: AsyncIterator[str]):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.job = job

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancelled.set()


def _raise_event_error(event: tuple) -> None:
    _, status, message = event
    raise APIError(status, message, type="invalid_request_error" if status < 500 else "server_error")


class _Shape:
    """OpenAI response objects for one request (chat or text completion)."""

    def __init__(self, ident: str, model: str, chat: bool):
        self.ident, self.model, self.chat, self.created = ident, model, chat, int(time.time())

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self.ident, "object": obj, "created": self.created, "model": self.model}

    def whole(self, text: str, finish: str, usage: dict) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish}
            return {**self._base("chat.completion"), "choices": [choice], "usage": usage}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return {**self._base("text_completion"), "choices": [choice], "usage": usage}

    def chunk(self, text: str | None, finish: str | None = None, role: bool = False) -> dict[str, Any]:
        if self.chat:
            delta = {} if text is None else {"content": text}
            if role:
                delta = {"role": "assistant", **delta}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {**self._base("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return {**self._base("text_completion"), "choices": [choice]}

    def usage_chunk(self, usage: dict) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._base(obj), "choices": [], "usage": usage}


def _sse_line(payload: dict | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


async def _sse(shape: _Shape, first: tuple, events: asyncio.Queue, job: GenerationRequest,
               include_usage: bool) -> AsyncIterator[str]:
    """One chunk per completed block; a disconnect cancels this generator, which cancels the job."""
    def with_usage(chunk: dict) -> dict:
        return {**chunk, "usage": None} if include_usage else chunk

    try:
        if shape.chat:
            yield _sse_line(with_usage(shape.chunk("", role=True)))
        event = first
        while True:
            if event[0] == "delta":
                yield _sse_line(with_usage(shape.chunk(event[1])))
            elif event[0] == "done":
                yield _sse_line(with_usage(shape.chunk(None, finish=event[1])))
                if include_usage:
                    yield _sse_line(shape.usage_chunk(event[2]))
                yield _sse_line("[DONE]")
                return
            elif event[0] == "error":  # headers are gone: report in-band, as OpenAI does
                yield _sse_line(APIError(event[1], event[2]).body())
                yield _sse_line("[DONE]")
                return
            event = await events.get()
    finally:
        job.cancelled.set()
