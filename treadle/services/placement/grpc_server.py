"""gRPC servicer of placement; ``build_server`` starts it with health checking.

Called by ``python -m treadle.services.placement``, local mode and the tests.
"""

from __future__ import annotations

from typing import Any

from treadle.services.grpcutil import convert
from treadle.services.grpcutil import server as grpc_server
from treadle.services.placement import protocol, service
from treadle.v1 import placement_pb2, placement_pb2_grpc

SERVICE_NAME = "treadle.v1.Placement"


class PlacementServicer(placement_pb2_grpc.PlacementServicer):
    def __init__(self, svc: service.PlacementService) -> None:
        self.svc = svc

    async def RegisterWorker(self, request: placement_pb2.Worker, context: Any) -> placement_pb2.Worker:
        return self.svc.register_worker(request)

    async def ReportLoad(
        self, request: placement_pb2.WorkerLoad, context: Any
    ) -> placement_pb2.ReportLoadResponse:
        self.svc.report_load(request)
        return placement_pb2.ReportLoadResponse()

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


async def build_server(
    svc: service.PlacementService, *, host: str = "127.0.0.1", port: int = 0
) -> grpc_server.Served:
    """Start placement on ``host:port`` (0: a free port) and return it, SERVING."""
    servicer = PlacementServicer(svc)
    return await grpc_server.start(
        [lambda s: placement_pb2_grpc.add_PlacementServicer_to_server(servicer, s)],
        services=[SERVICE_NAME],
        host=host,
        port=port,
    )
