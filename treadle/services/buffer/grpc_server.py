"""gRPC servicer of the buffer; ``build_server`` starts it on a port with health checking.

Called by ``python -m treadle.services.buffer``, local mode and the tests. Servicers only convert;
``BufferService`` validates and decides, and errors become statuses in ``grpcutil.server``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from treadle.services.buffer import service
from treadle.services.grpcutil import server as grpc_server
from treadle.services.grpcutil import status
from treadle.v1 import buffer_pb2, buffer_pb2_grpc

SERVICE_NAME = "treadle.v1.Buffer"


class BufferServicer(buffer_pb2_grpc.BufferServicer):
    def __init__(self, svc: service.BufferService) -> None:
        self.svc = svc

    async def Put(self, request: buffer_pb2.PutRequest, context: Any) -> buffer_pb2.PutResponse:
        result = await self.svc.put(request.trajectories)
        return buffer_pb2.PutResponse(stored=result.stored, duplicates=result.duplicates)

    async def GetBatch(self, request: buffer_pb2.GetBatchRequest, context: Any) -> buffer_pb2.Batch:
        return await self.svc.get_batch(
            batch_size=request.batch_size, version=request.version, timeout_s=request.timeout_s,
            lease_s=request.lease_s, agent=request.agent,
        )  # fmt: skip

    async def StreamBatch(
        self, request: buffer_pb2.GetBatchRequest, context: Any
    ) -> AsyncIterator[buffer_pb2.Batch]:
        async for micro in self.svc.stream_batch(
            batch_size=request.batch_size, micro_batch_size=request.micro_batch_size, version=request.version,
            timeout_s=request.timeout_s, lease_s=request.lease_s, agent=request.agent,
        ):  # fmt: skip
            yield micro

    async def AwaitUpdate(
        self, request: buffer_pb2.AwaitUpdateRequest, context: Any
    ) -> buffer_pb2.UnifiedUpdate:
        return await self.svc.await_update(agent=request.agent, timeout_s=request.timeout_s)

    async def Ack(self, request: buffer_pb2.AckRequest, context: Any) -> buffer_pb2.AckResponse:
        return buffer_pb2.AckResponse(trajectories=await self.svc.ack(request.batch_id))

    async def Stats(self, request: buffer_pb2.BufferStatsRequest, context: Any) -> buffer_pb2.BufferStats:
        return await self.svc.stats()


async def build_server(
    svc: service.BufferService,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    max_message_bytes: int = status.DEFAULT_MAX_MESSAGE_BYTES,
    token: str | None = None,
) -> grpc_server.Served:
    """Start the buffer on ``host:port`` (0: a free port) and return it, SERVING."""
    servicer = BufferServicer(svc)
    return await grpc_server.start(
        [lambda s: buffer_pb2_grpc.add_BufferServicer_to_server(servicer, s)],
        services=[SERVICE_NAME],
        host=host,
        port=port,
        token=token,
        max_message_bytes=max_message_bytes,
    )
