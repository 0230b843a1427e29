"""The OpenAI-compatible HTTP API: ``create_app(engine, served_model_name, api_key=None, limits=Limits())``.

Handlers validate on the event loop and tokenize in a thread (a long prompt must not freeze
``/health`` or other clients), then hand the request to the engine's worker, which decodes
requests that arrive together in one batched ``generate`` (:mod:`.engine`), and wait for its
events on an asyncio queue (delivered in bursts by :class:`_Dispatcher`). A streamed answer
starts only once decoding has begun, so anything ``generate`` refuses still gets a plain 400;
after that the client receives one SSE chunk per completed diffusion block. A client that leaves
(while queued, waiting for a whole answer, or mid-stream) is noticed at once: a queued request
gives up its place, a running one leaves its batch after the current diffusion iteration (the
other rows decode on). Body size, read time and connections are bounded by :mod:`.guard`, which
also refuses what a web page could send behind the user's back (a foreign ``Host``, a body that
is not ``application/json``). No CORS headers are ever sent, so no other origin can read an
answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Sequence
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .engine import Engine, GenerationRequest, QueueFull
from .guard import Guard, Limits, allowed_hosts_problem, api_key_problem, host_policy
from .metrics import content_type, offload_figures
from .protocol import APIError, GenerationOptions, clip, parse_json, resolve_max_tokens
from .schema import ChatCompletionBody, CompletionBody, openapi_body, parse_chat, parse_completion, schema_components

logger = logging.getLogger(__name__)


def _error_response(err: APIError) -> JSONResponse:
    headers = {"Retry-After": "1"} if err.status == 429 else None
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


def create_app(engine: Engine, served_model_name: str, api_key: str | None = None,
               limits: Limits | None = None, host: str = "127.0.0.1", allowed_hosts: Sequence[str] = ()) -> FastAPI:
    """The app; ``api_key`` (when given) guards /v1, /metrics and /openapi.json; /health stays open.

    ``host`` is the address the server is bound to and ``allowed_hosts`` the extra ``Host`` names it
    answers (``--allowed-hosts``); together they set the DNS-rebinding guard (:func:`.guard.host_policy`).
    """
    problem = api_key_problem(api_key) or allowed_hosts_problem(allowed_hosts)
    if problem:
        raise ValueError(problem)
    limits = limits or Limits()
    created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        yield

    app = FastAPI(title="oled-hf", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(Guard, metrics=engine.metrics, limits=limits, hosts=host_policy(host, api_key, allowed_hosts),
                       arrivals=engine)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, err: APIError):
        return _error_response(err)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code)
        return _error_response(APIError(err.status_code, f"{request.method} {clip(request.url.path)}: {err.detail}",
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
            raise APIError(404, f"the model '{clip(name)}' does not exist; this server serves '{served_model_name}'",
                           param="model", code="model_not_found")

    def model_card() -> dict[str, Any]:
        return {"id": served_model_name, "object": "model", "created": created, "owned_by": "oled-hf"}

    @app.get("/health")
    async def health():
        body = {"status": "ok" if engine.alive else "stopped", "model": served_model_name,
                "queue_depth": engine.queue_depth, "running": engine.running}
        return JSONResponse(body, status_code=200 if engine.alive else 503)

    app.head("/health", include_in_schema=False)(health)  # load balancers' and monitors' probe (no body)

    @app.get("/metrics")
    async def metrics(request: Request):
        authorize(request)
        text = engine.metrics.render(engine.queue_depth, engine.running, offload_figures(engine.model))
        return Response(text, media_type=content_type())

    def openapi_document() -> dict[str, Any]:
        """FastAPI's document plus the request models' nested schemas (the routes parse their own bodies)."""
        if app.openapi_schema is None:
            document = get_openapi(title=app.title, version=app.version, routes=app.routes)
            document.setdefault("components", {}).setdefault("schemas", {}).update(schema_components())
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi_document

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(request: Request):
        authorize(request)  # the schema tells a scanner what to call: behind the key like the API
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False)
    async def docs(request: Request):
        """FastAPI's Swagger UI over /openapi.json (behind the key like it; its script comes from a CDN)."""
        authorize(request)
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title}: {served_model_name}")

    @app.get("/v1/models")
    async def list_models(request: Request):
        authorize(request)
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    async def get_model(name: str, request: Request):
        authorize(request)
        check_model(name)
        return model_card()

    @app.post("/v1/chat/completions", openapi_extra=openapi_body(ChatCompletionBody))
    async def chat_completions(request: Request):
        authorize(request)
        req = parse_chat(parse_json(await request.body()))
        check_model(req.model)
        refuse_if_surely_too_long(sum(len(m["content"]) for m in req.messages), "messages")
        try:
            input_ids = await asyncio.to_thread(engine.encode_chat, req.messages)
        except Exception as err:  # the chat template refused the conversation
            raise APIError(400, f"the chat template could not render 'messages': {err}", param="messages") from None
        refuse_mask(input_ids, "messages")
        return await _generate(request, req, input_ids, "messages", chat=True)

    @app.post("/v1/completions", openapi_extra=openapi_body(CompletionBody))
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
            refuse_if_surely_too_long(len(req.prompt), "prompt")
            input_ids = await asyncio.to_thread(engine.encode_text, req.prompt)
        refuse_mask(input_ids, "prompt")
        return await _generate(request, req, input_ids, "prompt", chat=False)

    def refuse_if_surely_too_long(chars: int, param: str) -> None:
        """Refuse, without tokenizing, text that cannot fit the context however it tokenizes."""
        at_least = engine.min_tokens(chars)
        if at_least > engine.context_length:
            raise APIError(400, f"the prompt has {chars} characters, at least {at_least} tokens: more than the "
                                f"model's context of {engine.context_length} tokens", param=param,
                           code="context_length_exceeded")

    def refuse_mask(input_ids: torch.Tensor, param: str) -> None:
        mask = engine.mask_token_id
        if mask is not None and bool((input_ids == mask).any()):
            raise APIError(400, f"the prompt contains the mask token (id {mask}), which the diffusion decoder would "
                                "overwrite: remove it (chat content keeps such text as text)", param=param,
                           code="invalid_value")

    async def _generate(request: Request, req: GenerationOptions, input_ids, prompt_param: str, chat: bool):
        block = req.block_length or engine.block_length
        if block > engine.context_length:
            raise APIError(400, f"'block_length' is {block}, longer than the model's context of "
                                f"{engine.context_length} tokens", param="block_length", code="invalid_value")
        max_tokens = resolve_max_tokens(int(input_ids.shape[1]), req.max_tokens, engine.default_max_tokens, block,
                                        engine.context_length, prompt_param)
        events: asyncio.Queue = asyncio.Queue()
        emit = _dispatcher(asyncio.get_running_loop()).sender(events)

        job = GenerationRequest(input_ids=input_ids, max_tokens=max_tokens, emit=emit, stop=req.stop,
                                temperature=req.temperature, top_p=req.top_p, seed=req.seed,
                                block_length=req.block_length, threshold=req.threshold,
                                presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty)
        try:
            engine.submit(job)
            engine.arrived()  # (counted as arriving since the Guard let it in: the worker may wait for it)
        except QueueFull as err:
            raise APIError(429, str(err), code="queue_full", type="rate_limit_error") from None
        except ValueError as err:
            raise APIError(400, str(err)) from None
        watcher = asyncio.create_task(_watch_disconnect(request, engine, job, events))
        try:
            first = await _next_event(events)
            if first[0] == "error":
                _raise_event_error(first)
            ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
            shape = _Shape(ident, served_model_name, chat)
            if req.stream:  # from here the response watches its client itself
                watcher.cancel()
                return _JobStream(engine, job, _sse(shape, first, events, engine, job, req.include_usage))
            pieces = []
            while (event := await _next_event(events))[0] == "delta":
                pieces.append(event[1])
            if event[0] == "error":
                _raise_event_error(event)
            return shape.whole("".join(pieces), event[1], event[2])
        except BaseException:
            engine.cancel(job)
            raise
        finally:
            watcher.cancel()

    return app


GONE = ("gone",)


class _Dispatcher:
    """Hands the worker's events to the event loop, one loop wake-up for all that came together.

    Each ``call_soon_threadsafe`` wakes the loop, which takes the GIL from the worker in the middle
    of decoding; a batch of eight produces ~24 events (start, text, done per row) at a few instants,
    and one wake-up per event cost more than the decoding of a small model. Events queue here
    (in order) and the first one of a burst schedules the single flush that delivers them all.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._pending: list[tuple[asyncio.Queue, tuple]] = []
        self._lock = threading.Lock()

    def sender(self, events: asyncio.Queue):
        def emit(event: tuple) -> None:
            with self._lock:
                self._pending.append((events, event))
                first = len(self._pending) == 1
            if first:
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
                    self.loop.call_soon_threadsafe(self._flush)
        return emit

    def _flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for events, event in pending:
            events.put_nowait(event)


_DISPATCHERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _dispatcher(loop: asyncio.AbstractEventLoop) -> _Dispatcher:
    """The loop's dispatcher (one per event loop, made on first use)."""
    found = _DISPATCHERS.get(loop)
    if found is None:
        found = _DISPATCHERS[loop] = _Dispatcher(loop)
    return found


async def _watch_disconnect(request: Request, engine: Engine, job: GenerationRequest, events: asyncio.Queue) -> None:
    """Wait for the client to hang up; then cancel the job at once and wake the handler.

    The body has been read already, so the only message left to receive is ``http.disconnect``.
    Waiting for it (rather than polling between events) notices a departure even while blocks
    keep arriving, and frees a queued request's place immediately.
    """
    while (await request.receive())["type"] != "http.disconnect":
        pass
    engine.cancel(job)
    events.put_nowait(GONE)


async def _next_event(events: asyncio.Queue) -> tuple:
    """The worker's next event; the client's departure (from the watcher) becomes a 499."""
    event = await events.get()
    if event is GONE:
        raise APIError(499, "the client closed the request", code="client_closed_request")
    return event


class _JobStream(StreamingResponse):
    """An SSE response that cancels its job however it ends (finished, client gone, server stopping)."""

    def __init__(self, engine: Engine, job: GenerationRequest, content: AsyncIterator[str]):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.engine, self.job = engine, job

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.engine.cancel(self.job)


EVENT_CODES = {499: "client_closed_request", 504: "request_timeout"}


def _raise_event_error(event: tuple) -> None:
    _, status, message = event
    raise APIError(status, message, type="invalid_request_error" if status < 500 else "server_error",
                   code=EVENT_CODES.get(status))


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
    """One server-sent event: ``data: <json>`` and a blank line (what OpenAI sends, ``[DONE]`` last).

    Hand-written because the framing is this one line: no ``event``, ``id`` or ``retry`` fields, and
    ``json.dumps`` never emits a newline, so no payload needs splitting over several ``data:`` lines.
    ``sse-starlette`` (3.5, the maintained helper) was weighed and left out: it would add a
    dependency, 15-second ping comments, and at import it replaces uvicorn's process-wide
    ``Server.handle_exit`` to learn of shutdowns, while this server stops its engine on uvicorn's own
    lifespan; disconnects are already noticed by Starlette's ``StreamingResponse`` (which
    :class:`_JobStream` extends to cancel the job however the stream ends).
    """
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


async def _sse(shape: _Shape, first: tuple, events: asyncio.Queue, engine: Engine, job: GenerationRequest,
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
                yield _sse_line(APIError(event[1], event[2], code=EVENT_CODES.get(event[1]),
                                         type="invalid_request_error" if event[1] < 500 else "server_error").body())
                yield _sse_line("[DONE]")
                return
            event = await events.get()
    finally:
        engine.cancel(job)
