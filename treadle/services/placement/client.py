"""Async gRPC client of placement, used by the scheduler, agents (load reports) and tests.

Raises the same ``treadle.errors`` the service raises (``grpcutil.status.from_rpc_error``).
"""

from __future__ import annotations

import grpc

from treadle.services.grpcutil import status
from treadle.v1 import placement_pb2, placement_pb2_grpc


class PlacementClient:
    def __init__(self, address: str) -> None:
        self._channel = grpc.aio.insecure_channel(address, options=status.channel_options())
        self._stub = placement_pb2_grpc.PlacementStub(self._channel)

    async def register_worker(self, worker: placement_pb2.Worker) -> placement_pb2.Worker:
        try:
            reply: placement_pb2.Worker = await self._stub.RegisterWorker(worker)
        except grpc.aio.AioRpcError as exc:
            raise status.from_rpc_error(exc, what="placement.RegisterWorker") from exc
        return reply

    async def report_load(self, load: placement_pb2.WorkerLoad) -> None:
        try:
            await self._stub.ReportLoad(load)
        except grpc.aio.AioRpcError as exc:
            raise status.from_rpc_error(exc, what="placement.ReportLoad") from exc

    async def assign(self, req: placement_pb2.AssignRequest) -> placement_pb2.Assignment:
        try:
            reply: placement_pb2.Assignment = await self._stub.Assign(req)
        except grpc.aio.AioRpcError as exc:
            raise status.from_rpc_error(exc, what="placement.Assign") from exc
        return reply

    async def release(self, req: placement_pb2.ReleaseRequest) -> None:
        try:
            await self._stub.Release(req)
        except grpc.aio.AioRpcError as exc:
            raise status.from_rpc_error(exc, what="placement.Release") from exc

    async def place_batch(self, req: placement_pb2.PlaceBatchRequest) -> placement_pb2.PlaceBatchResponse:
        try:
            reply: placement_pb2.PlaceBatchResponse = await self._stub.PlaceBatch(req)
        except grpc.aio.AioRpcError as exc:
            raise status.from_rpc_error(exc, what="placement.PlaceBatch") from exc
        return reply

    async def migrate(self, from_worker_id: str) -> int:
        try:
            reply = await self._stub.Migrate(placement_pb2.MigrateRequest(from_worker_id=from_worker_id))
        except grpc.aio.AioRpcError as exc:
            raise status.from_rpc_error(exc, what="placement.Migrate") from exc
        return int(reply.moved)

    async def pool_state(self) -> placement_pb2.PoolStateResponse:
        try:
            reply: placement_pb2.PoolStateResponse = await self._stub.PoolState(
                placement_pb2.PoolStateRequest()
            )
        except grpc.aio.AioRpcError as exc:
            raise status.from_rpc_error(exc, what="placement.PoolState") from exc
        return reply

    async def aclose(self) -> None:
        await self._channel.close()
