"""Caller side of every Treadle HTTP service: one pooled connection set per client, and the mapping of
HTTP failures to ``treadle.errors``.

Connection errors, timeouts and 5xx become ``Unavailable`` (retryable); 404 ``NotFound``; 409
``Conflict``; 429 ``Overloaded``; 400/413/422 and other 4xx ``SpecError`` with the field taken
from the body's ``param``.

The transport is aiohttp, not httpx: with thousands of requests in flight on one client (the
scheduler's 2,000 trajectories), httpx's connection pool spent tens of milliseconds per request
here (500 concurrent GETs took 10.6 s against 2,000 in 5 s with aiohttp, same server). The pool
has no connection cap by default, so a request never waits for one (waiting would eat its timeout).
The session is created lazily inside the running loop, so clients can be built anywhere.
"""

from __future__ import annotations

import json as jsonlib
from typing import Any

import aiohttp
import pydantic

from treadle import errors

JSON_HEADERS = {"Content-Type": "application/json"}


class Client:
    """A JSON-over-HTTP client bound to one base URL."""

    def __init__(
        self, base_url: str, *, timeout_s: float, max_connections: int = 0, keepalive_s: float = 30.0
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.keepalive_s = keepalive_s
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # Idle connections are dropped before the server's keep-alive ends (75 s for ours,
            # httputil.serve; 5 s for vLLM, so the agent passes 3 s).
            connector = aiohttp.TCPConnector(
                limit=self.max_connections, ttl_dns_cache=300, keepalive_timeout=self.keepalive_s
            )
            self._session = aiohttp.ClientSession(connector=connector, timeout=self.timeout)
        return self._session

    async def request(
        self, method: str, path: str, *, json: Any = None, content: bytes | None = None
    ) -> tuple[int, bytes]:
        """(status, body) of one request; connection failures and timeouts raise ``Unavailable``.

        ``content`` is a body already encoded as JSON (by a typed encoder on the hot path)."""
        url = f"{self.base_url}{path}"
        headers = JSON_HEADERS if content is not None else None
        try:
            async with self._get_session().request(
                method, url, json=json, data=content, headers=headers
            ) as response:
                return response.status, await response.read()
        except TimeoutError as exc:
            raise errors.Unavailable(f"{method} {url}: timed out after {self.timeout.total}s") from exc
        except aiohttp.ClientError as exc:
            raise errors.Unavailable(f"{method} {url}: {type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def new_client(
    base_url: str, *, timeout_s: float, max_connections: int = 0, keepalive_s: float = 30.0
) -> Client:
    """``max_connections`` 0 means no cap (the server bounds its own concurrency)."""
    return Client(base_url, timeout_s=timeout_s, max_connections=max_connections, keepalive_s=keepalive_s)


async def call(client: Client, method: str, path: str, *, json: Any = None) -> Any:
    """Send one request; the decoded JSON body (or None when empty), or the mapped error."""
    status, body = await client.request(method, path, json=json)
    if status < 400:
        return jsonlib.loads(body) if body else None
    raise from_response(status, body)


async def call_raw(client: Client, method: str, path: str, *, content: bytes | None = None) -> bytes:
    """Like ``call`` but the body is sent and returned as encoded JSON bytes, for typed codecs."""
    status, body = await client.request(method, path, content=content)
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
