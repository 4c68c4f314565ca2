"""Caller-side mapping of HTTP failures to ``treadle.errors``, shared by every service client.

Connection errors, timeouts and 5xx become ``Unavailable`` (retryable); 404 ``NotFound``; 409
``Conflict``; 400/413/422 and other 4xx ``SpecError`` with the field taken from the body's ``param``.
"""

from __future__ import annotations

from typing import Any

import httpx
import pydantic

from treadle import errors


def new_client(base_url: str, *, timeout_s: float, max_connections: int = 1000) -> httpx.AsyncClient:
    """One pooled client per service client; the pool bounds concurrent connections to the server."""
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    return httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(timeout_s), limits=limits)


async def call(client: httpx.AsyncClient, method: str, path: str, *, json: Any = None) -> Any:
    """Send one request; the decoded JSON body (or None when empty), or the mapped error."""
    try:
        response = await client.request(method, path, json=json)
    except httpx.TimeoutException as exc:
        raise errors.Unavailable(
            f"{method} {client.base_url}{path}: timed out ({type(exc).__name__})"
        ) from exc
    except httpx.TransportError as exc:
        raise errors.Unavailable(f"{method} {client.base_url}{path}: {type(exc).__name__}: {exc}") from exc
    if response.status_code < 400:
        return response.json() if response.content else None
    raise from_response(response)


def from_response(response: httpx.Response) -> errors.TreadleError:
    """The ``treadle.errors`` exception that an error response stands for."""
    message, param = _parse(response)
    code = response.status_code
    if code >= 500:
        return errors.Unavailable(f"HTTP {code}: {message}")
    if code == 404:
        return errors.NotFound(message)
    if code == 409:
        return errors.Conflict(message)
    field = param or "body"
    prefix = f"{field}: "
    return errors.SpecError(message.removeprefix(prefix), field=field)


def _parse(response: httpx.Response) -> tuple[str, str | None]:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or response.reason_phrase, None
    info = body.get("error") if isinstance(body, dict) else None
    if not isinstance(info, dict):
        return str(body)[:500], None
    param = info.get("param")
    return str(info.get("message", "")), param if isinstance(param, str) else None


def from_validation(exc: pydantic.ValidationError) -> errors.SpecError:
    """A request model that failed to build on the caller's side, as the server would have refused it."""
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or "body"
    return errors.SpecError(first["msg"], field=field, value=first.get("input"))
