"""Async gRPC client of the buffer, used by the scheduler (put), trainers (get_batch/ack) and tests.

Raises the same ``treadle.errors`` the service raises (``grpcutil.status.from_rpc_error``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import grpc

from treadle.services.buffer import protocol
from treadle.services.grpcutil import status
from treadle.v1 import buffer_pb2, buffer_pb2_grpc, common_pb2


class BufferClient:
    def __init__(self, address: str, *, max_message_bytes: int = status.DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self._channel = grpc.aio.insecure_channel(address, options=status.channel_options(max_message_bytes))
        self._stub = buffer_pb2_grpc.BufferStub(self._channel)

    async def put(self, trajectories: Sequence[common_pb2.Trajectory]) -> protocol.PutResult:
        try:
            reply = await self._stub.Put(buffer_pb2.PutRequest(trajectories=trajectories))
        except grpc.aio.AioRpcError as exc:
            raise status.from_rpc_error(exc, what="buffer.Put") from exc
        return protocol.PutResult(stored=reply.stored, duplicates=reply.duplicates)

    async def get_batch(
        self, *, batch_size: int, version: int, timeout_s: float, lease_s: float = 0.0, agent: str = ""
    ) -> buffer_pb2.Batch:
        req = buffer_pb2.GetBatchRequest(
            batch_size=batch_size, version=version, timeout_s=timeout_s, lease_s=lease_s, agent=agent
        )
        try:
            reply: buffer_pb2.Batch = await self._stub.GetBatch(req)
        except grpc.aio.AioRpcError as exc:
            raise status.from_rpc_error(exc, what="buffer.GetBatch") from exc
        return reply

    async def stream_batch(
        self, *, batch_size: int, micro_batch_size: int, version: int, timeout_s: float, lease_s: float = 0.0,
        agent: str = "",
    ) -> AsyncIterator[buffer_pb2.Batch]:  # fmt: skip
        req = buffer_pb2.GetBatchRequest(
            batch_size=batch_size, micro_batch_size=micro_batch_size, version=version, timeout_s=timeout_s,
            lease_s=lease_s, agent=agent,
        )  # fmt: skip
        try:
            async for micro in self._stub.StreamBatch(req):
                yield micro
        except grpc.aio.AioRpcError as exc:
            raise status.from_rpc_error(exc, what="buffer.StreamBatch") from exc

    async def ack(self, batch_id: str) -> int:
        try:
            reply = await self._stub.Ack(buffer_pb2.AckRequest(batch_id=batch_id))
        except grpc.aio.AioRpcError as exc:
            raise status.from_rpc_error(exc, what="buffer.Ack") from exc
        return int(reply.trajectories)

    async def await_update(self, *, agent: str, timeout_s: float) -> buffer_pb2.UnifiedUpdate:
        """Block until every agent is through the pipeline step (FlexMARL's unified update)."""
        req = buffer_pb2.AwaitUpdateRequest(agent=agent, timeout_s=timeout_s)
        try:
            reply: buffer_pb2.UnifiedUpdate = await self._stub.AwaitUpdate(req)
        except grpc.aio.AioRpcError as exc:
            raise status.from_rpc_error(exc, what="buffer.AwaitUpdate") from exc
        return reply

    async def stats(self) -> buffer_pb2.BufferStats:
        try:
            reply: buffer_pb2.BufferStats = await self._stub.Stats(buffer_pb2.BufferStatsRequest())
        except grpc.aio.AioRpcError as exc:
            raise status.from_rpc_error(exc, what="buffer.Stats") from exc
        return reply

    async def aclose(self) -> None:
        await self._channel.close()
