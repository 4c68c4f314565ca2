"""Caller side of every Treadle HTTP service: one pool of keep-alive connections per client, and the
mapping of HTTP failures to ``treadle.errors``.

Connection errors, timeouts and 5xx become ``Unavailable`` (retryable); 404 ``NotFound``; 409
``Conflict``; 429 ``Overloaded``; 400/413/422 and other 4xx ``SpecError`` with the field taken
from the body's ``param``.

A request given ``connect_wait_s`` waits that long (within its timeout) for a server that refuses
connections, a process restarting on its port, before it fails: nothing was sent, so trying again
is safe for any request. It logs what it waits for; the error after says how long it waited.

The transport is HTTP/1.1 over asyncio streams: requests are written here (JSON bodies to services we
run or to vLLM), replies are parsed by httptools (llhttp, the parser uvicorn uses), and the pool is
ours. It sits on the hot path of every turn twice (scheduler -> agent,
agent -> engine). httpx's pool spent tens of milliseconds per request with thousands in flight on
one client (500 concurrent GETs took 10.6 s against 2,000 in 5 s with aiohttp, same server); aiohttp
then was the agent's largest cost per turn: with 250 chat requests in flight to the simulated
engine it took 210-270 us of the caller's CPU per request, this 105-145 us, at the same latency.
The pool has no connection cap by default, so a request never waits for one (waiting would eat its
timeout). A request that is cancelled or fails closes its
connection rather than returning it: the server sees the disconnect (vLLM and the simulated engine
abort the request on it) and no half-read reply is left for the next caller. Nothing is bound to an
event loop before the first request, so clients can be built anywhere.
"""

from __future__ import annotations

import asyncio
import collections
import json as jsonlib
import logging
import time
import urllib.parse
from typing import Any

import httptools
import pydantic

from treadle import auth, errors

_READ_BYTES = 64 * 1024
RESTART_WAIT_S = 20.0
"""How long a turn's or a score's call waits for a peer restarting on its port (a container restart
takes seconds); what does not come back in that time fails the call as ``Unavailable``."""
log = logging.getLogger(__name__)


class _Connection:
    __slots__ = ("idle_since", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer, self.idle_since = reader, writer, 0.0


class Client:
    """A JSON-over-HTTP client bound to one base URL."""

    def __init__(
        self, base_url: str, *, timeout_s: float, max_connections: int = 0, keepalive_s: float = 30.0,
        token: str | None = None,
    ) -> None:  # fmt: skip
        self.base_url = base_url.rstrip("/")
        parts = urllib.parse.urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise errors.SpecError("must be an http(s)://host[:port] URL", field="base_url", value=base_url)
        self._host, self._tls = parts.hostname, parts.scheme == "https"
        self._port = parts.port or (443 if self._tls else 80)
        self._prefix = parts.path
        self._host_header = parts.netloc.encode("latin-1")
        # The job's token on every request (treadle.auth), in the head written once per request.
        self._auth = b"" if token is None else b"%s: %s\r\n" % (
            auth.HEADER.encode(), auth.header_value(token).encode("latin-1"),
        )  # fmt: skip
        self.timeout_s = timeout_s
        # Idle connections are dropped before the server's keep-alive ends (75 s for ours,
        # httputil.serve; 5 s for vLLM, so the agent passes 3 s).
        self.keepalive_s = keepalive_s
        self.max_connections = max_connections
        self._slots = asyncio.Semaphore(max_connections) if max_connections else None
        self._idle: collections.deque[_Connection] = collections.deque()

    async def request(
        self, method: str, path: str, *, json: Any = None, content: bytes | None = None,
        connect_wait_s: float = 0.0,
    ) -> tuple[int, bytes]:  # fmt: skip
        """(status, body) of one request; connection failures and timeouts raise ``Unavailable``.

        ``content`` is a body already encoded as JSON (by a typed encoder on the hot path);
        ``connect_wait_s``: how long a refused connection is tried again (the module's docstring)."""
        if json is not None:
            content = jsonlib.dumps(json).encode()
        waiting = _Waiting(f"{method} {self.base_url}{path}", connect_wait_s)
        try:
            async with asyncio.timeout(self.timeout_s):
                if self._slots is None:
                    return await self._exchange(method, path, content, waiting)
                async with self._slots:
                    return await self._exchange(method, path, content, waiting)
        except TimeoutError as exc:
            raise errors.Unavailable(
                f"{method} {self.base_url}{path}: timed out after {self.timeout_s}s"
            ) from exc
        except (OSError, asyncio.IncompleteReadError, httptools.HttpParserError, ValueError) as exc:
            raise errors.Unavailable(f"{method} {self.base_url}{path}: {type(exc).__name__}: {exc}") from exc

    async def _exchange(
        self, method: str, path: str, content: bytes | None, waiting: _Waiting
    ) -> tuple[int, bytes]:
        conn = self._idle_connection() or await self._connect(waiting)
        kept = False
        try:
            head = b"%s %s HTTP/1.1\r\nHost: %s\r\n%s" % (
                method.encode("ascii"), (self._prefix + path).encode("latin-1"), self._host_header,
                self._auth,
            )  # fmt: skip
            if content is not None:
                head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(content)
            conn.writer.write(head + b"\r\n" + content if content is not None else head + b"\r\n")
            status, body, kept = await _response(conn.reader)
            return status, body
        finally:
            if kept:
                conn.idle_since = time.monotonic()
                self._idle.append(conn)
            else:
                conn.writer.close()

    def _idle_connection(self) -> _Connection | None:
        """The most recently used idle connection still fresh and open; stale ones are closed."""
        horizon = time.monotonic() - self.keepalive_s
        while self._idle:
            conn = self._idle.pop()
            if conn.idle_since > horizon and not conn.reader.at_eof():
                return conn
            conn.writer.close()
        return None

    async def _connect(self, waiting: _Waiting) -> _Connection:
        while True:
            try:
                reader, writer = await asyncio.open_connection(self._host, self._port, ssl=self._tls or None)
            except ConnectionRefusedError as exc:
                await waiting.again(exc)
                continue
            return _Connection(reader, writer)

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop().writer.close()


class _Waiting:
    """The bounded wait of one request for a server that refuses connections."""

    __slots__ = ("budget_s", "delay", "since", "what")

    def __init__(self, what: str, budget_s: float) -> None:
        self.what, self.budget_s, self.delay, self.since = what, budget_s, 0.05, 0.0

    async def again(self, exc: ConnectionRefusedError) -> None:
        """Sleep before the next try, or raise once the budget is spent (saying how long it waited)."""
        now = time.monotonic()
        if not self.since:
            self.since = now
            if self.budget_s > 0:
                log.warning("%s: connection refused; waiting up to %gs for it to come back", self.what,
                            self.budget_s)  # fmt: skip
        waited = now - self.since
        if waited + self.delay > self.budget_s:
            if self.budget_s > 0:
                raise ConnectionRefusedError(exc.errno, f"{exc.strerror} for {waited:.1f}s") from exc
            raise exc
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, 1.0)


class _Reply:
    """httptools' callbacks for one response: the body pieces, and how far the message got."""

    __slots__ = ("body", "complete", "framed", "headers_done", "keep_alive", "parser")

    def __init__(self) -> None:
        self.body: list[bytes] = []
        self.complete = self.framed = self.headers_done = self.keep_alive = False
        self.parser = httptools.HttpResponseParser(self)

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True
        # llhttp answers keep-alive only while the message is current; after it, the parser resets.
        self.keep_alive = self.parser.should_keep_alive()


async def _response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """(status, body, whether the connection may be reused) of one HTTP/1.x response."""
    reply = _Reply()
    while not reply.complete:
        data = await reader.read(_READ_BYTES)
        if not data:
            if reply.headers_done and not reply.framed:  # a body delimited by the server closing
                return reply.parser.get_status_code(), b"".join(reply.body), False
            raise asyncio.IncompleteReadError(b"".join(reply.body), None)
        reply.parser.feed_data(data)
    return reply.parser.get_status_code(), b"".join(reply.body), reply.keep_alive


def new_client(
    base_url: str, *, timeout_s: float, max_connections: int = 0, keepalive_s: float = 30.0,
    token: str | None = None,
) -> Client:  # fmt: skip
    """``max_connections`` 0 means no cap (the server bounds its own concurrency); ``token``: the
    job's, sent on every request (None: none, for a server outside any job, or vLLM)."""
    return Client(
        base_url, timeout_s=timeout_s, max_connections=max_connections, keepalive_s=keepalive_s, token=token
    )


async def call(
    client: Client, method: str, path: str, *, json: Any = None, connect_wait_s: float = 0.0
) -> Any:
    """Send one request; the decoded JSON body (or None when empty), or the mapped error."""
    status, body = await client.request(method, path, json=json, connect_wait_s=connect_wait_s)
    if status < 400:
        return jsonlib.loads(body) if body else None
    raise from_response(status, body)


async def call_raw(
    client: Client, method: str, path: str, *, content: bytes | None = None, connect_wait_s: float = 0.0
) -> bytes:
    """Like ``call`` but the body is sent and returned as encoded JSON bytes, for typed codecs."""
    status, body = await client.request(method, path, content=content, connect_wait_s=connect_wait_s)
    if status < 400:
        return body
    raise from_response(status, body)


async def text(client: Client, path: str) -> str:
    """GET a text body (``/metrics``); errors mapped as for ``call``."""
    status, body = await client.request("GET", path)
    if status >= 400:
        raise from_response(status, body)
    return body.decode("utf-8", errors="replace")


def from_response(status: int, body: bytes) -> errors.TreadleError:
    """The ``treadle.errors`` exception that an error response stands for."""
    message, param = _parse(body, status)
    if status >= 500:
        return errors.Unavailable(f"HTTP {status}: {message}")
    if status == 401:
        return errors.Unauthenticated(message)
    if status == 404:
        return errors.NotFound(message)
    if status == 409:
        return errors.Conflict(message)
    if status == 429:
        return errors.Overloaded(message)
    field = param or "body"
    return errors.SpecError(message.removeprefix(f"{field}: "), field=field)


def _parse(body: bytes, status: int) -> tuple[str, str | None]:
    try:
        decoded = jsonlib.loads(body)
    except ValueError:
        return body[:500].decode("utf-8", errors="replace") or f"HTTP {status}", None
    info = decoded.get("error") if isinstance(decoded, dict) else None
    if not isinstance(info, dict):
        return str(decoded)[:500], None
    param = info.get("param")
    return str(info.get("message", "")), param if isinstance(param, str) else None


def from_validation(exc: pydantic.ValidationError) -> errors.SpecError:
    """A request model that failed to build on the caller's side, as the server would have refused it."""
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or "body"
    return errors.SpecError(first["msg"], field=field, value=first.get("input"))
