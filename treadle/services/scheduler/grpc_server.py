"""gRPC servicer of the scheduler; ``build_server`` starts it with health checking.

Called by ``python -m treadle.services.scheduler``, local mode and the tests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from treadle.services.grpcutil import convert
from treadle.services.grpcutil import server as grpc_server
from treadle.services.scheduler import protocol, service
from treadle.v1 import scheduler_pb2, scheduler_pb2_grpc

SERVICE_NAME = "treadle.v1.Scheduler"


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, svc: service.SchedulerService) -> None:
        self.svc = svc

    async def Submit(
        self, request: scheduler_pb2.SubmitRequest, context: Any
    ) -> scheduler_pb2.SubmitResponse:
        groups = [convert.from_pb(protocol.PromptGroup, g) for g in request.groups]
        return convert.to_pb(await self.svc.submit(groups), scheduler_pb2.SubmitResponse)

    async def StreamResults(
        self, request: scheduler_pb2.StreamResultsRequest, context: Any
    ) -> AsyncIterator[scheduler_pb2.TrajectoryResult]:
        async for result in self.svc.results():
            yield convert.to_pb(result, scheduler_pb2.TrajectoryResult)

    async def CommitVersion(
        self, request: scheduler_pb2.CommitVersionRequest, context: Any
    ) -> scheduler_pb2.CommitVersionResponse:
        committed = await self.svc.commit_version(
            request.version,
            step=request.step,
            mean_reward=request.mean_reward if request.HasField("mean_reward") else None,
        )
        return convert.to_pb(committed, scheduler_pb2.CommitVersionResponse)

    async def Suspend(
        self, request: scheduler_pb2.SuspendRequest, context: Any
    ) -> scheduler_pb2.SchedulerStats:
        return stats_to_pb(self.svc.suspend())

    async def Resume(
        self, request: scheduler_pb2.ResumeRequest, context: Any
    ) -> scheduler_pb2.SchedulerStats:
        return stats_to_pb(self.svc.resume())

    async def Stats(
        self, request: scheduler_pb2.SchedulerStatsRequest, context: Any
    ) -> scheduler_pb2.SchedulerStats:
        return stats_to_pb(self.svc.stats())

    async def ListTrajectories(
        self, request: scheduler_pb2.ListTrajectoriesRequest, context: Any
    ) -> scheduler_pb2.ListTrajectoriesResponse:
        listing = self.svc.list_trajectories(request.limit)
        return scheduler_pb2.ListTrajectoriesResponse(
            total=listing.total,
            trajectories=[convert.to_pb(t, scheduler_pb2.TrajectoryState) for t in listing.trajectories],
        )


def stats_to_pb(stats: protocol.Stats) -> scheduler_pb2.SchedulerStats:
    tasks = [convert.to_pb(t, scheduler_pb2.TaskStats) for t in stats.tasks]
    return convert.to_pb(stats, scheduler_pb2.SchedulerStats, tasks=tasks)


async def build_server(
    svc: service.SchedulerService, *, host: str = "127.0.0.1", port: int = 0, token: str | None = None
) -> grpc_server.Served:
    """Start the scheduler on ``host:port`` (0: a free port) and return it, SERVING."""
    servicer = SchedulerServicer(svc)
    return await grpc_server.start(
        [lambda s: scheduler_pb2_grpc.add_SchedulerServicer_to_server(servicer, s)],
        services=[SERVICE_NAME],
        host=host,
        port=port,
        token=token,
    )
