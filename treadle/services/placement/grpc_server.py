"""gRPC servicer of placement; ``build_server`` starts it with health checking.

Called by ``python -m treadle.services.placement``, local mode and the tests.
"""

from __future__ import annotations

from typing import Any

from treadle import errors
from treadle.services.grpcutil import convert
from treadle.services.grpcutil import server as grpc_server
from treadle.services.placement import protocol, service, weightsync
from treadle.v1 import placement_pb2, placement_pb2_grpc

SERVICE_NAME = "treadle.v1.Placement"


class PlacementServicer(placement_pb2_grpc.PlacementServicer):
    def __init__(self, svc: service.PlacementService, sync: weightsync.WeightSync | None = None) -> None:
        self.svc = svc
        self.sync = sync

    async def RegisterWorker(self, request: placement_pb2.Worker, context: Any) -> placement_pb2.Worker:
        return self.svc.register_worker(request)

    async def ReportLoad(
        self, request: placement_pb2.WorkerLoad, context: Any
    ) -> placement_pb2.ReportLoadResponse:
        self.svc.report_load(request)
        apply = self.sync is not None and self.sync.apply_weights
        target = self.svc.target_for(request.worker_id)
        agent = self.svc.weights_agent(self.svc.serving(request.worker_id))
        return placement_pb2.ReportLoadResponse(
            weight_version=target, apply_weights=apply, weights_agent=agent
        )

    async def Assign(self, request: placement_pb2.AssignRequest, context: Any) -> placement_pb2.Assignment:
        assigned = self.svc.assign(convert.from_pb(protocol.AssignRequest, request))
        return convert.to_pb(assigned, placement_pb2.Assignment)

    async def Release(
        self, request: placement_pb2.ReleaseRequest, context: Any
    ) -> placement_pb2.ReleaseResponse:
        self.svc.release(convert.from_pb(protocol.ReleaseRequest, request))
        return placement_pb2.ReleaseResponse()

    async def Migrate(
        self, request: placement_pb2.MigrateRequest, context: Any
    ) -> placement_pb2.MigrateResponse:
        return placement_pb2.MigrateResponse(moved=self.svc.migrate(request.from_worker_id))

    async def PoolState(
        self, request: placement_pb2.PoolStateRequest, context: Any
    ) -> placement_pb2.PoolStateResponse:
        return self.svc.pool_state()

    async def PlaceBatch(
        self, request: placement_pb2.PlaceBatchRequest, context: Any
    ) -> placement_pb2.PlaceBatchResponse:
        return placement_pb2.PlaceBatchResponse(placed=self.svc.place_batch(protocol.batch_from_pb(request)))

    async def PrefetchWeights(
        self, request: placement_pb2.PrefetchWeightsRequest, context: Any
    ) -> placement_pb2.SwapWeightsResponse:
        req = protocol.SwapRequest(version=request.version, agent=request.agent)
        return protocol.swap_result_to_pb(await self._sync().prefetch(req))

    async def SwapWeights(
        self, request: placement_pb2.SwapWeightsRequest, context: Any
    ) -> placement_pb2.SwapWeightsResponse:
        req = convert.from_pb(protocol.SwapRequest, request)
        return protocol.swap_result_to_pb(await self._sync().swap(req))

    def _sync(self) -> weightsync.WeightSync:
        if self.sync is None:
            raise errors.Unavailable("this placement was started without weight sync")
        return self.sync


async def build_server(
    svc: service.PlacementService,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    sync: weightsync.WeightSync | None = None,
    token: str | None = None,
) -> grpc_server.Served:
    """Start placement on ``host:port`` (0: a free port) and return it, SERVING; ``sync`` answers
    ``SwapWeights`` and ``PrefetchWeights`` (``Unavailable`` without it)."""
    servicer = PlacementServicer(svc, sync)
    return await grpc_server.start(
        [lambda s: placement_pb2_grpc.add_PlacementServicer_to_server(servicer, s)],
        services=[SERVICE_NAME],
        host=host,
        port=port,
        token=token,
    )
