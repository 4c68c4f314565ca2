"""Async gRPC client of placement, used by the scheduler, agents (load reports) and tests.

Raises the same ``treadle.errors`` the service raises (``grpcutil.status.from_rpc_error``).
"""

from __future__ import annotations

from treadle.services.grpcutil import channel, convert, status
from treadle.services.placement import protocol
from treadle.v1 import placement_pb2, placement_pb2_grpc

SWAP_ANSWER_S = 30.0
"""Beyond a swap's own deadline, for placement to cancel the last swaps and answer."""


class PlacementClient:
    def __init__(self, address: str, *, token: str | None = None) -> None:
        self._channel = channel.open_channel(address, token=token)
        self._stub = placement_pb2_grpc.PlacementStub(self._channel)

    async def register_worker(self, worker: placement_pb2.Worker) -> placement_pb2.Worker:
        return await status.unary(self._stub.RegisterWorker(worker), what="placement.RegisterWorker")

    async def report_load(self, load: placement_pb2.WorkerLoad) -> placement_pb2.ReportLoadResponse:
        """Report; the answer says which version the worker's agent should serve (weight sync)."""
        return await status.unary(self._stub.ReportLoad(load), what="placement.ReportLoad")

    async def assign(self, req: protocol.AssignRequest) -> protocol.Assignment:
        msg = convert.to_pb(req, placement_pb2.AssignRequest)
        reply = await status.unary(self._stub.Assign(msg), what="placement.Assign")
        return convert.from_pb(protocol.Assignment, reply)

    async def release(self, req: protocol.ReleaseRequest) -> None:
        msg = convert.to_pb(req, placement_pb2.ReleaseRequest)
        await status.unary(self._stub.Release(msg), what="placement.Release")

    async def place_batch(self, req: protocol.PlaceBatchRequest) -> int:
        reply = await status.unary(
            self._stub.PlaceBatch(protocol.batch_to_pb(req)), what="placement.PlaceBatch"
        )
        return int(reply.placed)

    async def migrate(self, from_worker_id: str) -> int:
        req = placement_pb2.MigrateRequest(from_worker_id=from_worker_id)
        reply = await status.unary(self._stub.Migrate(req), what="placement.Migrate")
        return int(reply.moved)

    async def pool_state(self) -> placement_pb2.PoolStateResponse:
        return await status.unary(
            self._stub.PoolState(placement_pb2.PoolStateRequest()), what="placement.PoolState"
        )

    async def prefetch_weights(self, version: int, *, agent: str = "") -> protocol.SwapResult:
        req = placement_pb2.PrefetchWeightsRequest(version=version, agent=agent)
        reply = await status.unary(self._stub.PrefetchWeights(req), what="placement.PrefetchWeights")
        return protocol.swap_result_from_pb(reply)

    async def swap_weights(
        self, version: int, *, agent: str = "", timeout_s: float = 300.0
    ) -> protocol.SwapResult:
        """Every worker of ``agent`` to ``version`` (``weightsync.WeightSync.swap``); waits up to
        ``timeout_s`` and a little more for the answer."""
        req = protocol.SwapRequest(version=version, agent=agent, timeout_s=timeout_s)
        msg = convert.to_pb(req, placement_pb2.SwapWeightsRequest)
        call = self._stub.SwapWeights(msg, timeout=timeout_s + SWAP_ANSWER_S)
        return protocol.swap_result_from_pb(await status.unary(call, what="placement.SwapWeights"))

    async def aclose(self) -> None:
        await self._channel.close()
