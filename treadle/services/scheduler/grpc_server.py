"""gRPC servicer of the scheduler; ``build_server`` starts it with health checking.

Called by ``python -m treadle.services.scheduler``, local mode and the tests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from treadle.services.grpcutil import server as grpc_server
from treadle.services.scheduler import service
from treadle.v1 import scheduler_pb2, scheduler_pb2_grpc

SERVICE_NAME = "treadle.v1.Scheduler"


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, svc: service.SchedulerService) -> None:
        self.svc = svc

    async def Submit(
        self, request: scheduler_pb2.SubmitRequest, context: Any
    ) -> scheduler_pb2.SubmitResponse:
        return await self.svc.submit(request.groups)

    async def StreamResults(
        self, request: scheduler_pb2.StreamResultsRequest, context: Any
    ) -> AsyncIterator[scheduler_pb2.TrajectoryResult]:
        async for result in self.svc.results():
            yield result

    async def CommitVersion(
        self, request: scheduler_pb2.CommitVersionRequest, context: Any
    ) -> scheduler_pb2.CommitVersionResponse:
        return await self.svc.commit_version(request.version)

    async def Suspend(
        self, request: scheduler_pb2.SuspendRequest, context: Any
    ) -> scheduler_pb2.SchedulerStats:
        return self.svc.suspend()

    async def Resume(
        self, request: scheduler_pb2.ResumeRequest, context: Any
    ) -> scheduler_pb2.SchedulerStats:
        return self.svc.resume()

    async def Stats(
        self, request: scheduler_pb2.SchedulerStatsRequest, context: Any
    ) -> scheduler_pb2.SchedulerStats:
        return self.svc.stats()

    async def ListTrajectories(
        self, request: scheduler_pb2.ListTrajectoriesRequest, context: Any
    ) -> scheduler_pb2.ListTrajectoriesResponse:
        return self.svc.list_trajectories(request.limit)


async def build_server(
    svc: service.SchedulerService, *, host: str = "127.0.0.1", port: int = 0
) -> grpc_server.Served:
    """Start the scheduler on ``host:port`` (0: a free port) and return it, SERVING."""
    servicer = SchedulerServicer(svc)
    return await grpc_server.start(
        [lambda s: scheduler_pb2_grpc.add_SchedulerServicer_to_server(servicer, s)],
        services=[SERVICE_NAME],
        host=host,
        port=port,
    )
