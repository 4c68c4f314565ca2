"""Build a Treadle FastAPI app: request ids, a body-size limit, HTTP metrics, ``/healthz``, ``/metrics``.

Every service's ``build_app`` starts from ``new_app`` and adds its routes. The middleware is plain
ASGI (no ``BaseHTTPMiddleware``) because the agent sits on the hot path of every turn. Metrics go to
the registry the caller passes in (one per app, never the global default), so tests can build many.
"""

from __future__ import annotations

import contextvars
import itertools
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import fastapi
import prometheus_client
from fastapi import responses
from starlette import types

from treadle import auth, errors, metrics
from treadle.services.httputil import errors as http_errors

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
"""Bodies above this are refused with 413 before parsing (env actions, code, chat histories)."""

_Counter, _Histogram = prometheus_client.Counter, prometheus_client.Histogram
OPEN_PATHS = frozenset({"/healthz", "/metrics"})
"""Paths anyone may call without the job's token: the kubelet's probes and Prometheus's scrapes."""
Lifespan = Callable[[fastapi.FastAPI], AbstractAsyncContextManager[None]]


class EdgeMiddleware:
    """Request id (``x-request-id`` in, echoed out), the job's token, body-size limit, request count and
    latency.

    The token is checked here rather than in a FastAPI dependency: routes on the hot path are served
    as plain Starlette endpoints that skip dependency solving (the agent's ``/v1/generate``), and a
    dependency there would silently not run; here every request passes, before any route."""

    def __init__(
        self, app: types.ASGIApp, *, registry: prometheus_client.CollectorRegistry, max_body_bytes: int,
        token: str | None = None,
    ) -> None:  # fmt: skip
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.token = token
        self.requests = prometheus_client.Counter(
            metrics.HTTP_REQUESTS_TOTAL, "HTTP requests by route and status", ["route", "status"],
            registry=registry,
        )  # fmt: skip
        self.seconds = prometheus_client.Histogram(
            metrics.HTTP_REQUEST_SECONDS, "HTTP request latency by route", ["route"], registry=registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )  # fmt: skip
        # Label children looked up once per (route, status): labels() locks and hashes on every call.
        self._children: dict[
            tuple[str, int], tuple[prometheus_client.Counter, prometheus_client.Histogram]
        ] = {}
        # Ids minted here are this process's random prefix and a counter (uuid4 reads os.urandom per call).
        self._id_prefix = uuid.uuid4().hex[:12]
        self._ids = itertools.count()

    async def __call__(self, scope: types.Scope, receive: types.Receive, send: types.Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        rid = (
            headers.get(b"x-request-id", b"").decode("latin-1")[:128]
            or f"{self._id_prefix}{next(self._ids):x}"
        )
        token = request_id.set(rid)
        started = time.perf_counter()
        status = 500
        length = headers.get(b"content-length")
        try:
            if self.token is not None and scope["path"] not in OPEN_PATHS:
                presented = headers.get(auth.HEADER.encode(), b"").decode("latin-1") or None
                if (reason := auth.refusal(presented, self.token)) is not None:
                    refused = errors.Unauthenticated(f"{scope['method']} {scope['path']}: {reason}")
                    response = http_errors.to_response(refused)
                    response.headers["x-request-id"] = rid
                    status = response.status_code
                    await response(scope, receive, send)
                    return
            if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
                too_large = http_errors.PayloadTooLarge(
                    f"request body of {int(length)} bytes exceeds the limit of {self.max_body_bytes}",
                    field="body",
                )
                response = http_errors.to_response(too_large)
                response.headers["x-request-id"] = rid
                status = response.status_code
                await response(scope, receive, send)
                return

            async def send_with_id(message: types.Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                    message.setdefault("headers", [])
                    message["headers"] = [*message["headers"], (b"x-request-id", rid.encode("latin-1"))]
                await send(message)

            if length is None and scope["method"] in ("POST", "PUT", "PATCH"):
                # Chunked body without Content-Length: read it here, within the limit, then replay.
                receive = await self._buffered(receive)
            await self.app(scope, receive, send_with_id)
        except http_errors.PayloadTooLarge as exc:
            response = http_errors.to_response(exc)
            status = response.status_code
            await response(scope, receive, send)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            children = self._children.get((route, status))
            if children is None:
                children = (self.requests.labels(route, str(status)), self.seconds.labels(route))
                self._children[(route, status)] = children
            children[0].inc()
            children[1].observe(time.perf_counter() - started)
            request_id.reset(token)

    async def _buffered(self, receive: types.Receive) -> types.Receive:
        messages: list[types.Message] = []
        seen = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            seen += len(message.get("body", b""))
            if seen > self.max_body_bytes:
                raise http_errors.PayloadTooLarge(
                    f"request body exceeds the limit of {self.max_body_bytes} bytes", field="body"
                )
            if not message.get("more_body", False):
                break
        replay = iter(messages)

        async def replayed() -> types.Message:
            return next(replay, None) or await receive()

        return replayed


def new_app(
    *,
    title: str,
    registry: prometheus_client.CollectorRegistry,
    lifespan: Lifespan | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ready: Callable[[], bool] | None = None,
    token: str | None = None,
) -> fastapi.FastAPI:
    """A FastAPI app with Treadle's edges; ``ready`` (default: always) drives ``/healthz``.

    ``token``: every route but ``OPEN_PATHS`` requires it (``treadle.auth``, checked in
    ``EdgeMiddleware``); None (tests of one service, a server outside any job) accepts every caller."""
    app = fastapi.FastAPI(title=title, lifespan=lifespan, responses=http_errors.ERROR_RESPONSES)
    app.state.registry = registry
    http_errors.install_error_handlers(app)
    app.add_middleware(EdgeMiddleware, registry=registry, max_body_bytes=max_body_bytes, token=token)
    is_ready = ready or (lambda: True)

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict[str, str]:
        if not is_ready():
            raise errors.Unavailable("not ready")
        return {"status": "ok"}

    @app.get("/metrics", tags=["ops"], response_class=responses.PlainTextResponse)
    async def prometheus_metrics() -> responses.Response:
        body = prometheus_client.generate_latest(registry)
        return responses.Response(body, media_type=prometheus_client.CONTENT_TYPE_LATEST)

    return app


def registry() -> prometheus_client.CollectorRegistry:
    """A fresh registry for one app instance (never the process-global default)."""
    return prometheus_client.CollectorRegistry(auto_describe=True)
