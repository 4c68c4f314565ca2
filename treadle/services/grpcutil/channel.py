"""The client side's channel to a Treadle gRPC service: message limits and the job's token on every call.

Every service's ``client`` opens its channel here. The token travels as ``authorization: Bearer <token>``
metadata (``treadle.auth``), which the server's interceptor checks; call credentials would need a TLS
channel, which the job's pods do not have (``docs/SECURITY.md``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from treadle import auth
from treadle.services.grpcutil import status


class _Token(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    """Adds the job's token to the metadata of every call."""

    def __init__(self, token: str) -> None:
        self.header = (auth.HEADER, auth.header_value(token))

    def _with_token(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), self.header)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )

    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await continuation(self._with_token(details), request)

    async def intercept_unary_stream(
        self, continuation: Callable[..., Any], details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await continuation(self._with_token(details), request)


def open_channel(
    address: str, *, token: str | None, max_message_bytes: int = status.DEFAULT_MAX_MESSAGE_BYTES
) -> grpc.aio.Channel:
    """A channel to ``address`` sending ``token`` on every call (None: none, for a server without one)."""
    return grpc.aio.insecure_channel(
        address,
        options=status.channel_options(max_message_bytes),
        interceptors=[_Token(token)] if token is not None else None,
    )
