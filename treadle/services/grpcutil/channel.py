"""The client side's channel to a Treadle gRPC service: message limits and the job's token on every call.

Every service's ``client`` opens its channel here. The token travels as ``authorization: Bearer <token>``
metadata (``treadle.auth``), which the server's interceptor checks; call credentials would need a TLS
channel, which the job's pods do not have (``docs/SECURITY.md``).

grpc.aio files each client interceptor under the first of the four call kinds it is an instance of
(unary-unary, unary-stream, stream-unary, stream-stream: an if/elif chain in ``grpc/aio/_channel.py``),
so one object implementing several kinds intercepts only the first; the token therefore comes from
one interceptor per kind (``token_interceptors``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from treadle import auth
from treadle.services.grpcutil import status


class _Token:
    """The job's token added to a call's metadata (shared by the four interceptors below)."""

    def __init__(self, token: str) -> None:
        self.header = (auth.HEADER, auth.header_value(token))

    def _with_token(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), self.header)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )


class _UnaryUnary(_Token, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await continuation(self._with_token(details), request)


class _UnaryStream(_Token, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_stream(
        self, continuation: Callable[..., Any], details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await continuation(self._with_token(details), request)


class _StreamUnary(_Token, grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_unary(
        self, continuation: Callable[..., Any], details: grpc.aio.ClientCallDetails, requests: Any
    ) -> Any:
        return await continuation(self._with_token(details), requests)


class _StreamStream(_Token, grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_stream(
        self, continuation: Callable[..., Any], details: grpc.aio.ClientCallDetails, requests: Any
    ) -> Any:
        return await continuation(self._with_token(details), requests)


def token_interceptors(token: str) -> list[grpc.aio.ClientInterceptor]:
    """One interceptor per call kind, each adding ``token`` to the call's metadata."""
    return [kind(token) for kind in (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream)]


def open_channel(
    address: str, *, token: str | None, max_message_bytes: int = status.DEFAULT_MAX_MESSAGE_BYTES
) -> grpc.aio.Channel:
    """A channel to ``address`` sending ``token`` on every call (None: none, for a server without one)."""
    return grpc.aio.insecure_channel(
        address,
        options=status.channel_options(max_message_bytes),
        interceptors=token_interceptors(token) if token is not None else None,
    )
