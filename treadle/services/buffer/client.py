"""Async gRPC client of the buffer, used by the scheduler (put), trainers (get_batch/ack) and tests.

Raises the same ``treadle.errors`` the service raises (``grpcutil.status.from_rpc_error``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import grpc

from treadle.services.buffer import protocol
from treadle.services.grpcutil import channel, status
from treadle.v1 import buffer_pb2, buffer_pb2_grpc, common_pb2


class BufferClient:
    def __init__(
        self, address: str, *, token: str | None = None,
        max_message_bytes: int = status.DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:  # fmt: skip
        self._channel = channel.open_channel(address, token=token, max_message_bytes=max_message_bytes)
        self._stub = buffer_pb2_grpc.BufferStub(self._channel)

    async def put(self, trajectories: Sequence[common_pb2.Trajectory]) -> protocol.PutResult:
        req = buffer_pb2.PutRequest(trajectories=trajectories)
        reply = await status.unary(self._stub.Put(req), what="buffer.Put")
        return protocol.PutResult(stored=reply.stored, duplicates=reply.duplicates)

    async def get_batch(
        self, *, batch_size: int, version: int, timeout_s: float, lease_s: float = 0.0, agent: str = ""
    ) -> buffer_pb2.Batch:
        req = buffer_pb2.GetBatchRequest(
            batch_size=batch_size, version=version, timeout_s=timeout_s, lease_s=lease_s, agent=agent
        )
        return await status.unary(self._stub.GetBatch(req), what="buffer.GetBatch")

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
        reply = await status.unary(
            self._stub.Ack(buffer_pb2.AckRequest(batch_id=batch_id)), what="buffer.Ack"
        )
        return int(reply.trajectories)

    async def await_update(self, *, agent: str, timeout_s: float) -> buffer_pb2.UnifiedUpdate:
        """Block until every agent is through the pipeline step (FlexMARL's unified update)."""
        req = buffer_pb2.AwaitUpdateRequest(agent=agent, timeout_s=timeout_s)
        return await status.unary(self._stub.AwaitUpdate(req), what="buffer.AwaitUpdate")

    async def stats(self) -> buffer_pb2.BufferStats:
        return await status.unary(self._stub.Stats(buffer_pb2.BufferStatsRequest()), what="buffer.Stats")

    async def aclose(self) -> None:
        await self._channel.close()
