"""Build, run and stop an asyncio gRPC server the same way for every Treadle service.

Each service's ``grpc_server.build_server(...)`` calls ``build``; its ``__main__`` calls ``serve``.
The server gets: the standard health service (SERVING once ``start`` returns, NOT_SERVING during
shutdown), one interceptor that sets a request id (``x-request-id`` metadata or a fresh one) and
turns every exception into a status via ``status.to_status``, a bound on concurrent RPCs, and a
maximum message size (oversized requests fail with RESOURCE_EXHAUSTED before reaching a servicer).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from treadle import auth, errors
from treadle.services.grpcutil import status

log = logging.getLogger(__name__)

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")

Register = Callable[[grpc.aio.Server], None]
OPEN_METHODS = "/grpc.health.v1.Health/"
"""Methods anyone may call without the job's token: the kubelet's probes and local mode's checks."""


@dataclasses.dataclass(frozen=True)
class _Malformed:
    """Stands in for a request whose bytes did not parse, so the handler can answer INVALID_ARGUMENT."""

    error: str


def _lenient(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    # grpc answers a deserializer exception with INTERNAL; bad bytes are the caller's error.
    if deserialize is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as exc:
            return _Malformed(f"{type(exc).__name__}: {exc}")

    return parse


async def _reject_malformed(req: Any, ctx: grpc.aio.ServicerContext) -> None:
    if isinstance(req, _Malformed):
        await ctx.abort(
            grpc.StatusCode.INVALID_ARGUMENT, f"request: not a valid message of this method ({req.error})"
        )


class _Interceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """The job's token checked (``token``: None checks nothing), request id in a ContextVar, malformed
    requests rejected, every exception mapped to a status."""

    def __init__(self, token: str | None) -> None:
        self.token = token

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], details: grpc.HandlerCallDetails
    ) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        metadata = dict(details.invocation_metadata or ())
        rid = metadata.get("x-request-id") or uuid.uuid4().hex[:16]
        method = details.method
        if self.token is not None and not method.startswith(OPEN_METHODS):
            reason = auth.refusal(metadata.get(auth.HEADER), self.token)
            if reason is not None:
                return _refusing(handler, errors.Unauthenticated(f"{method}: {reason}"))
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary(req: Any, ctx: grpc.aio.ServicerContext) -> Any:
                request_id.set(rid)
                await _reject_malformed(req, ctx)
                try:
                    return await inner(req, ctx)
                except Exception as exc:  # every failure leaves as a status
                    await _abort(ctx, exc, method, rid)

            return grpc.unary_unary_rpc_method_handler(
                unary, request_deserializer=_lenient(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )  # fmt: skip
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def stream(req: Any, ctx: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                request_id.set(rid)
                await _reject_malformed(req, ctx)
                try:
                    async for item in inner_stream(req, ctx):
                        yield item
                except Exception as exc:
                    await _abort(ctx, exc, method, rid)

            return grpc.unary_stream_rpc_method_handler(
                stream, request_deserializer=_lenient(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )  # fmt: skip
        return handler


def _refusing(handler: grpc.RpcMethodHandler, refused: errors.Unauthenticated) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s kind that answers UNAUTHENTICATED before any servicer code runs."""
    code, message = status.to_status(refused)

    async def refuse(req: Any, ctx: grpc.aio.ServicerContext) -> None:
        log.warning("refused %s", message)
        await ctx.abort(code, message)

    # grpc.aio takes a coroutine for every kind (a streaming one would stream through ctx.write); the
    # refusal keeps the handler's kind, so a client-streaming call is not read as a unary one.
    kind = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(bool(handler.request_streaming), bool(handler.response_streaming))]
    return kind(
        refuse, request_deserializer=_lenient(handler.request_deserializer),
        response_serializer=handler.response_serializer,
    )  # fmt: skip


async def _abort(ctx: grpc.aio.ServicerContext, exc: Exception, method: str, rid: str) -> None:
    if isinstance(exc, grpc.aio.AbortError):
        raise exc
    code, message = status.to_status(exc)
    if code == grpc.StatusCode.INTERNAL:
        log.exception("%s [request %s] failed", method, rid)
        message = f"internal error (request {rid})"
    await ctx.abort(code, message)


@dataclasses.dataclass
class Served:
    """A started server: the port it bound and its health servicer."""

    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    services: Sequence[str]

    async def stop(self, grace_s: float | None = 1.0) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)


async def start(
    register: Sequence[Register],
    *,
    services: Sequence[str],
    host: str = "127.0.0.1",
    port: int = 0,
    max_concurrent_rpcs: int = 10_000,
    max_message_bytes: int = status.DEFAULT_MAX_MESSAGE_BYTES,
    token: str | None = None,
) -> Served:
    """Bind ``host:port`` (0 picks a free port), start, and mark ``services`` SERVING.

    ``token``: every call but the health service's must carry it (``treadle.auth``); None (tests
    of one service, a server outside any job) accepts every caller."""
    server = grpc.aio.server(
        interceptors=[_Interceptor(token)],
        maximum_concurrent_rpcs=max_concurrent_rpcs,
        options=status.channel_options(max_message_bytes),
    )
    for add in register:
        add(server)
    checker = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"grpc: cannot bind {host}:{port}")
    await server.start()
    for name in ("", *services):
        await checker.set(name, health_pb2.HealthCheckResponse.SERVING)
    return Served(server=server, port=bound, health=checker, services=services)


async def serve_forever(
    served: Served, *, grace_s: float = 5.0, on_stop: Callable[[], Awaitable[None]] | None = None
) -> None:
    """Run until SIGTERM/SIGINT, then NOT_SERVING, stop with ``grace_s``, then ``on_stop``."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await served.stop(grace_s)
        if on_stop is not None:
            await on_stop()


async def check_health(address: str, service: str = "", *, timeout_s: float = 2.0) -> bool:
    """True when the server at ``address`` reports ``service`` SERVING (used by local mode)."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.aio.AioRpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
