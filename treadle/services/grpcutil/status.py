"""One mapping between ``treadle.errors`` and gRPC status codes, used by every server and client.

Servers call ``to_status`` from the interceptor in ``treadle.services.grpcutil.server`` so servicers
just raise; clients await calls through ``unary`` (streams: ``from_rpc_error``) so callers see the
same exceptions whether a service runs in-process or behind gRPC.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

import grpc

from treadle import errors

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
T = TypeVar("T")


def to_status(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and message a client sees for ``exc`` (never a traceback)."""
    match exc:
        case errors.SpecError():
            return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
        case errors.NotFound():
            return grpc.StatusCode.NOT_FOUND, str(exc)
        case errors.Conflict():
            return grpc.StatusCode.FAILED_PRECONDITION, str(exc)
        case errors.Overloaded():
            return grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
        case errors.Unavailable():
            return grpc.StatusCode.UNAVAILABLE, str(exc)
        case errors.Unauthenticated():
            return grpc.StatusCode.UNAUTHENTICATED, str(exc)
        case TimeoutError():
            return grpc.StatusCode.DEADLINE_EXCEEDED, str(exc) or "timed out"
        case _:
            return grpc.StatusCode.INTERNAL, "internal error"


def from_rpc_error(exc: grpc.aio.AioRpcError, *, what: str) -> errors.TreadleError | TimeoutError:
    """The exception a server's status stands for; ``what`` names the call for the message."""
    code = exc.code()
    details = exc.details() or ""
    message = f"{what}: {details}"
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        field, sep, rest = details.partition(": ")
        return errors.SpecError(rest if sep else details, field=field if sep else "request")
    if code == grpc.StatusCode.NOT_FOUND:
        return errors.NotFound(message)
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return errors.Conflict(message)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return errors.Overloaded(message)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return TimeoutError(message)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return errors.Unauthenticated(message)
    return errors.Unavailable(f"{message} ({code.name})")


async def unary(call: Awaitable[T], *, what: str) -> T:
    """Await one unary call; a gRPC error comes out as the ``treadle.errors`` it stands for."""
    try:
        return await call
    except grpc.aio.AioRpcError as exc:
        raise from_rpc_error(exc, what=what) from exc


def channel_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]
