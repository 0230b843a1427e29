"""What keeps one client from taking the server down: body, time and connection limits, API-key rules.

* :class:`Limits` holds every bound in one place (the CLI fills it; the README lists the defaults).
* :class:`Guard` is pure ASGI middleware (it never buffers a response, so SSE still streams). It
  reads a POST body itself, counting bytes: an announced ``Content-Length`` over the limit is
  answered 413 before a byte is read, a chunked body is cut off at the limit, and a body that
  trickles in slower than ``read_timeout`` is answered 408. It turns any exception that escapes
  the app into an OpenAI-style 500 without closing the connection, and counts requests for
  ``/metrics``.
* :func:`guarded_protocol` closes connections that open and never finish a request's headers
  (uvicorn only times out idle connections *after* a response), and at the connection limit closes
  the oldest idle one, so idle sockets cannot pile up until the process runs out of file
  descriptors or crowd out clients that do send requests.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from dataclasses import dataclass

from .protocol import APIError

logger = logging.getLogger(__name__)

BODY_METHODS = ("POST", "PUT", "PATCH")
_KEY_CHARACTERS = re.compile(r"[\x21-\x7e]+")  # visible ASCII: what an HTTP header carries unchanged


@dataclass(frozen=True)
class Limits:
    """Server-wide bounds; every one is a CLI flag of ``oled-moe serve``."""

    max_body_bytes: int = 1 << 20  # 1 MiB: far more than any context's worth of JSON text
    read_timeout: float = 10.0  # seconds to send a request's headers, and then its body
    keep_alive: float = 5.0  # seconds an idle keep-alive connection stays open after a response
    max_connections: int = 128  # open connections; past it the oldest idle one is closed
    request_timeout: float | None = 300.0  # seconds of generation per request (None: no limit)

    def problems(self) -> list[str]:
        """What is wrong with these values, named by their CLI flag (empty when all is well)."""
        out = []
        if self.max_body_bytes < 1024:
            out.append(f"--max-body-bytes {self.max_body_bytes} is invalid: must be at least 1024")
        for flag, value in (("--read-timeout", self.read_timeout), ("--keep-alive-timeout", self.keep_alive)):
            if not value > 0:
                out.append(f"{flag} {value:g} is invalid: must be more than 0 seconds")
        if self.max_connections < 4:
            out.append(f"--max-connections {self.max_connections} is invalid: must be at least 4")
        if self.request_timeout is not None and not self.request_timeout > 0:
            out.append(f"--request-timeout {self.request_timeout:g} is invalid: must be more than 0 seconds")
        return out

    def uvicorn_options(self) -> dict:
        """Keyword arguments for ``uvicorn.run`` / ``uvicorn.Config`` that apply these limits."""
        # uvicorn's own limit (503) sits above ours, which evicts idle connections first. The listen
        # backlog is also how many connections asyncio accepts in one burst (uvicorn's default, 2048,
        # would open that many descriptors at once under a flood, before any eviction could run), so
        # it is kept at half the connection limit: at most ~1.5 x max_connections sockets are open.
        return {"timeout_keep_alive": self.keep_alive, "limit_concurrency": self.max_connections + 16,
                "backlog": max(16, self.max_connections // 2),
                "http": guarded_protocol(self.read_timeout, self.max_connections)}


def api_key_problem(key: str | None) -> str | None:
    """Why ``key`` cannot work as an API key, or None (None itself means: no key required).

    A blank key can never be matched (clients' headers are trimmed), and an empty one would let
    an empty ``Bearer`` through; spaces or non-ASCII characters do not survive an HTTP header.
    """
    if key is None:
        return None
    if not key.strip():
        return "--api-key is blank: give a real key (visible ASCII characters), or leave --api-key out"
    if not _KEY_CHARACTERS.fullmatch(key):
        return ("--api-key must be visible ASCII characters only (no spaces, tabs or non-ASCII), so that clients "
                "can send it in an 'Authorization: Bearer KEY' header")
    return None


class _BodyTooLarge(APIError):
    def __init__(self, limit: int, seen: str):
        super().__init__(413, f"the request body is {seen}, more than this server's limit of {limit} bytes "
                              "(--max-body-bytes)", code="request_too_large")


async def _send_error(send, err: APIError, close: bool = False) -> None:
    """An error object; ``close`` when the body was not read, so the connection cannot carry another request."""
    body = json.dumps(err.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": err.status,
                "headers": headers + ([(b"connection", b"close")] if close else [])})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """Body limit, body read deadline, error objects for escaped exceptions, request counts."""

    def __init__(self, app, metrics, limits: Limits):
        self.app, self.metrics, self.limits = app, metrics, limits

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = None

        async def send_and_note(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            if scope["method"] in BODY_METHODS:
                try:
                    receive = await self._read_body(scope, receive)
                except APIError as err:
                    return await _send_error(send_and_note, err, close=True)
                if receive is None:  # the client left while sending
                    status = 499
                    return
            await self.app(scope, receive, send_and_note)
        except Exception as err:  # a bug: still an error object, and the connection stays usable
            logger.exception("unhandled error on %s %s", scope["method"], scope["path"])
            if status is None:
                await _send_error(send_and_note, APIError(500, f"internal server error ({type(err).__name__})",
                                                          type="server_error", code="internal_error"))
        finally:
            self.metrics.count_request(scope["path"], status or 500)

    async def _read_body(self, scope, receive):
        """The whole body, read under the size and time limits, replayed to the app as one message."""
        limit = self.limits.max_body_bytes
        announced = dict(scope["headers"]).get(b"content-length")
        if announced is not None and announced.isdigit() and int(announced) > limit:
            raise _BodyTooLarge(limit, f"{int(announced)} bytes (Content-Length)")
        try:
            body = await asyncio.wait_for(_collect(receive, limit), self.limits.read_timeout)
        except asyncio.TimeoutError:
            raise APIError(408, f"the request body did not arrive within {self.limits.read_timeout:g} s "
                                "(--read-timeout)", code="request_timeout") from None
        if body is None:
            return None
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # later: http.disconnect, which handlers watch for

        return replay


async def _collect(receive, limit: int) -> bytes | None:
    """Read body messages until the last, stopping at ``limit`` bytes; None if the client disconnects."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _BodyTooLarge(limit, f"over {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def guarded_protocol(header_timeout: float, max_connections: int | None = None) -> type:
    """uvicorn's HTTP protocol class, hardened against connections that hold a socket and send nothing.

    * A connection must complete a request's headers within ``header_timeout`` seconds of opening
      (and of each response; uvicorn's keep-alive timeout usually closes it first). uvicorn itself
      never times out a connection that has not sent a request yet.
    * At ``max_connections`` open connections, a new one closes the oldest *idle* connection (no
      request in progress), so idle sockets cannot crowd out clients that do send requests, nor
      run the process out of file descriptors. Connections with a request running are never cut.
    """
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class GuardedHTTPProtocol(AutoHTTPProtocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._idle_since = time.monotonic()
            if max_connections is not None and len(self.connections) > max_connections:
                self._evict_oldest_idle()
            self._arm_header_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._idle_since = time.monotonic()
            self._arm_header_timer()

        def connection_lost(self, exc) -> None:
            timer = getattr(self, "_header_timer", None)
            if timer is not None:
                timer.cancel()
            super().connection_lost(exc)

        def _is_idle(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _evict_oldest_idle(self) -> None:
            idle = [c for c in self.connections if c is not self and getattr(c, "_is_idle", lambda: False)()
                    and not c.transport.is_closing()]
            if idle:
                oldest = min(idle, key=lambda c: c._idle_since)
                logger.info("closing an idle connection: %d connections are open (--max-connections)",
                            len(self.connections))
                oldest.transport.close()

        def _arm_header_timer(self) -> None:
            timer = getattr(self, "_header_timer", None)
            if timer is not None:
                timer.cancel()
            self._header_timer = self.loop.call_later(header_timeout, self._headers_overdue, self.cycle)

        def _headers_overdue(self, cycle_when_armed) -> None:
            # no request began since the timer was armed (idle, or headers trickling in): close.
            # A cycle still answering (a pipelined request already running) is never cut.
            idle = cycle_when_armed is None or cycle_when_armed.response_complete
            if self.cycle is cycle_when_armed and idle and not self.transport.is_closing():
                self.transport.close()

    GuardedHTTPProtocol.__name__ = GuardedHTTPProtocol.__qualname__ = f"Guarded{AutoHTTPProtocol.__name__}"
    return GuardedHTTPProtocol
