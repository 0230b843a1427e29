"""What keeps one client from taking the server down: body, time and connection limits, API-key rules.

Where uvicorn has the limit, uvicorn applies it (:meth:`Limits.uvicorn_options`):

* ``timeout_keep_alive``: an idle keep-alive connection closes ``keep_alive`` seconds after a response;
* ``limit_concurrency``: past ``max_connections + 16`` connections (or running requests) uvicorn
  answers 503 itself;
* ``h11_max_incomplete_event_size``: an unfinished request head (request line and headers) is
  buffered up to ``max_header_bytes``, then refused (uvicorn answers 400 and closes); a head that
  arrives whole in one read is parsed whatever its size, so this bounds memory held per slow
  connection, not header size as such;
* ``backlog``: how many connections the listening socket queues (see the comment there).

What uvicorn (0.54) cannot do stays here, each for a stated reason:

* :class:`Guard` is pure ASGI middleware (it never buffers a response, so SSE still streams). It
  first refuses requests a web page could make behind the user's back: a ``Host`` header that is not
  a name the server answers to (421; see :class:`HostPolicy`) and a POST body that is not
  ``application/json`` (415: a browser sends ``text/plain``, form or multipart bodies cross-origin
  without a CORS preflight, and this server answers no preflight); uvicorn checks neither (what
  Starlette's ``TrustedHostMiddleware`` lacks: :class:`HostPolicy`). Then it reads a POST body
  itself, counting bytes: uvicorn has no body-size limit and no body-read timeout, so an announced
  ``Content-Length`` over the limit is answered 413 before a byte is read, a chunked body is cut off
  at the limit, and a body that trickles in slower than ``read_timeout`` is answered 408. It turns
  any exception that escapes the app into an OpenAI-style 500 without closing the connection, counts
  requests for ``/metrics``, and marks generation requests as arriving (the engine may wait for them
  to join a batch).
* :func:`guarded_protocol` closes connections that open and never finish a request's headers:
  uvicorn arms its keep-alive timer only *after* a response (``on_response_complete``), so a
  connection that sends nothing, or headers one byte at a time, would stay open for ever. At the
  connection limit it closes the oldest *idle* one: uvicorn's ``limit_concurrency`` answers 503 to
  new requests instead, so idle sockets would crowd out clients that do send requests, or run the
  process out of file descriptors.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from .protocol import APIError, clip

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
    max_header_bytes: int = 16 * 1024  # an unfinished request head buffered (h11's own default, made explicit)

    def problems(self) -> list[str]:
        """What is wrong with these values, named by their CLI flag (empty when all is well)."""
        out = []
        if self.max_body_bytes < 1024:
            out.append(f"--max-body-bytes {self.max_body_bytes} is invalid: must be at least 1024")
        for flag, value in (("--read-timeout", self.read_timeout), ("--keep-alive-timeout", self.keep_alive)):
            if not value > 0:
                out.append(f"{flag} {value:g} is invalid: must be more than 0 seconds")
        if self.max_header_bytes < 1024:
            out.append(f"--max-header-bytes {self.max_header_bytes} is invalid: must be at least 1024")
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
                "h11_max_incomplete_event_size": self.max_header_bytes,
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


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` (a ``--host`` value) listens on this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


WILDCARD_BINDS = ("0.0.0.0", "::", "")
_HOST_NAME = re.compile(r"[a-z0-9_.-]+")  # after lowercasing; IPv6 literals come bracketed


def host_name(header: str) -> str | None:
    """The name in a ``Host`` header (lowercase, port and brackets removed, no trailing dot); None if malformed."""
    header = header.strip().lower()
    if header.startswith("["):  # [::1]:8000
        name, sep, rest = header[1:].partition("]")
        if not sep or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        try:
            ipaddress.IPv6Address(name)
        except ValueError:
            return None
        return name
    name, sep, port = header.rpartition(":")
    if not sep:
        name = header
    elif not port.isdigit():
        return None
    name = name.rstrip(".") if name not in (".", "") else name
    return name if _HOST_NAME.fullmatch(name) else None


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def allowed_hosts_problem(entries: Sequence[str]) -> str | None:
    """Why these ``--allowed-hosts`` entries cannot work, or None: names (``gpu.lan``), IP addresses,
    ``.example.com`` (that domain and its subdomains, as Django spells it) or ``*`` (any Host)."""
    for entry in entries:
        bare = entry.strip().lower()
        if bare == "*":
            continue
        name = bare[1:] if bare.startswith(".") else bare
        if not name or (host_name(name) != name.strip("[]") and _ip(name.strip("[]")) is None):
            return (f"--allowed-hosts entry {entry!r} is invalid: give host names or IP addresses without a port "
                    "or scheme (gpu.lan, 10.0.0.5, .example.com for a domain and its subdomains, * for any)")
    return None


@dataclass(frozen=True)
class HostPolicy:
    """Which ``Host`` header values the server answers: the guard against DNS rebinding.

    A page on ``evil.example`` whose DNS answer is switched to 127.0.0.1 becomes same-origin with a
    loopback server, so it could run the model and read the answers; its requests still carry
    ``Host: evil.example``. Names the attacker cannot control are allowed: ``localhost`` and
    ``*.localhost`` (browsers resolve those to loopback themselves), loopback IP addresses, the
    address the server is bound to (any IP address when bound to all interfaces: an IP literal
    cannot be rebound), and what ``--allowed-hosts`` adds. A request without ``Host`` (HTTP/1.0)
    passes: no browser sends one.

    Why not Starlette's ``TrustedHostMiddleware`` (1.10): it matches a list of exact names and
    ``*.domain`` suffixes (it parses ports and bracketed IPv6 well), but cannot say "every loopback
    address" (all of 127.0.0.0/8 and ::1) or "any IP literal" (a server bound to 0.0.0.0), does not
    drop a trailing dot (``localhost.``), refuses a request without ``Host``, and answers 400 with a
    plain-text body (or a ``www.`` redirect) instead of 421 with an OpenAI error object naming the
    name and ``--allowed-hosts``. Its rules would be a subset of these, so this class stays whole.
    """

    bound: str = "127.0.0.1"
    extra: tuple[str, ...] = ()

    def allows(self, name: str) -> bool:
        if name == "localhost" or name.endswith(".localhost") or name == self.bound.strip("[]").lower():
            return True
        ip = _ip(name)
        if ip is not None and (ip.is_loopback or self.bound in WILDCARD_BINDS):
            return True
        for entry in self.extra:
            entry = entry.strip().lower().strip("[]")
            if entry == "*" or name == entry or (entry.startswith(".") and (name == entry[1:]
                                                                           or name.endswith(entry))):
                return True
        return False

    def problem(self, header: bytes | None) -> APIError | None:
        """The refusal for this ``Host`` header, or None when the server answers it."""
        if header is None:
            return None
        text = header.decode("latin-1")
        name = host_name(text)
        if name is None:
            return APIError(400, f"the Host header {clip(text)!r} is malformed: expected a host name or IP address, "
                                 "optionally with ':port'", code="invalid_host")
        if self.allows(name):
            return None
        bound = (", any IP address" if self.bound in WILDCARD_BINDS
                 else "" if is_loopback(self.bound) else f", {self.bound}")
        extra = f", {', '.join(self.extra)}" if self.extra else ""
        return APIError(421, f"the Host header names {clip(name)!r}, which this server does not answer to (it "
                             f"answers localhost, *.localhost and loopback addresses{bound}{extra}): a web page "
                             "reaching a local server under a foreign name is refused (DNS-rebinding guard). Start "
                             "the server with --allowed-hosts NAME to allow a name", code="invalid_host")


def host_policy(bind: str, api_key: str | None, allowed_hosts: Sequence[str] = ()) -> HostPolicy | None:
    """The Host check for a server bound to ``bind``, or None when none applies.

    It applies to every server without an API key, and to a keyed one bound to loopback (where
    clients use loopback names anyway). A keyed server on a public address is reached under
    whatever names the machine has, and the key already stops a rebinding page (which cannot know
    it, and cannot send an ``Authorization`` header cross-origin without a preflight this server
    never approves): there the check applies only when ``--allowed-hosts`` is given. ``*`` turns it off.
    """
    extra = tuple(allowed_hosts)
    if "*" in (e.strip() for e in extra) or (api_key and not is_loopback(bind) and not extra):
        return None
    return HostPolicy(bound=bind.strip("[]").lower(), extra=extra)


JSON_MEDIA_TYPE = "application/json"


def content_type_problem(values: list[bytes]) -> APIError | None:
    """The 415 for a request body whose ``Content-Type`` is not JSON, or None.

    Only ``application/json`` (optionally ``; charset=utf-8``) is read: the types a browser sends
    cross-origin without a CORS preflight (``text/plain``, forms, multipart) are exactly the ones
    a hostile page would use. FastAPI refuses them for its own JSON bodies for the same reason.
    """
    allowed = f"this server accepts only '{JSON_MEDIA_TYPE}' request bodies (send 'Content-Type: {JSON_MEDIA_TYPE}')"
    if not values:
        return _unsupported(f"the request has no Content-Type header: {allowed}")
    if len(values) > 1:
        return _unsupported(f"the request has {len(values)} Content-Type headers: send one; {allowed}")
    text = values[0].decode("latin-1")
    media, _, params = text.partition(";")
    if media.strip().lower() != JSON_MEDIA_TYPE:
        return _unsupported(f"Content-Type {clip(text)!r} is not accepted: {allowed}")
    for param in params.split(";"):
        key, _, value = param.partition("=")
        charset = value.strip().strip('"').lower()
        if key.strip().lower() == "charset" and charset not in ("utf-8", "utf8"):
            return _unsupported(f"Content-Type {clip(text)!r} is not accepted: JSON bodies must be UTF-8 "
                                "('charset=utf-8' or no charset)")
    return None


def _unsupported(message: str) -> APIError:
    return APIError(415, message, code="unsupported_media_type")


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


GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions")


class Guard:
    """Host and content-type checks, body limit, body read deadline, error objects for escaped
    exceptions, request counts. ``hosts`` None: no Host check. ``arrivals`` (the engine): a
    generation request counts as arriving from here until it is submitted (``arrivals.arrival()``),
    the earliest point the app sees it, so the worker can wait for it to join a batch."""

    def __init__(self, app, metrics, limits: Limits, hosts: HostPolicy | None = None, arrivals=None):
        self.app, self.metrics, self.limits, self.hosts, self.arrivals = app, metrics, limits, hosts, arrivals

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        arriving = self.arrivals is not None and scope["method"] == "POST" and scope["path"] in GENERATION_PATHS
        with self.arrivals.arrival() if arriving else contextlib.nullcontext():
            await self._guard(scope, receive, send)

    async def _guard(self, scope, receive, send):
        status = None

        async def send_and_note(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            refusal = self._refusal(scope)
            if refusal is not None:  # the body (if any) is left unread: the connection closes
                return await _send_error(send_and_note, refusal, close=True)
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

    def _refusal(self, scope) -> APIError | None:
        """A request a web page could have sent behind the user's back (foreign Host, non-JSON body), or None."""
        headers = scope["headers"]
        if self.hosts is not None:
            hosts = [v for k, v in headers if k == b"host"]
            problem = (APIError(400, "the request has several Host headers: send one", code="invalid_host")
                       if len(hosts) > 1 else self.hosts.problem(hosts[0] if hosts else None))
            if problem is not None:
                return problem
        if scope["method"] in BODY_METHODS:
            return content_type_problem([v for k, v in headers if k == b"content-type"])
        return None

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
