"""Async gRPC client of the scheduler, used by trainers (commit, suspend/resume), local mode and tests.

Raises the same ``treadle.errors`` the service raises (``grpcutil.status.from_rpc_error``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import grpc

from treadle.services.grpcutil import channel, status
from treadle.v1 import scheduler_pb2, scheduler_pb2_grpc


def settled(stats: scheduler_pb2.SchedulerStats) -> bool:
    """Every submitted trajectory has ended (completed, failed or aborted) and been saved."""
    return stats.completed + stats.failed + stats.aborted == stats.submitted and stats.unsaved == 0


class SchedulerClient:
    def __init__(self, address: str, *, token: str | None = None) -> None:
        self._channel = channel.open_channel(address, token=token)
        self._stub = scheduler_pb2_grpc.SchedulerStub(self._channel)

    async def submit(self, groups: Sequence[scheduler_pb2.PromptGroup]) -> scheduler_pb2.SubmitResponse:
        return await status.unary(
            self._stub.Submit(scheduler_pb2.SubmitRequest(groups=groups)), what="scheduler.Submit"
        )

    async def results(self) -> AsyncIterator[scheduler_pb2.TrajectoryResult]:
        try:
            async for result in self._stub.StreamResults(scheduler_pb2.StreamResultsRequest()):
                yield result
        except grpc.aio.AioRpcError as exc:
            raise status.from_rpc_error(exc, what="scheduler.StreamResults") from exc

    async def commit_version(
        self, version: int, *, step: int = 0, mean_reward: float | None = None
    ) -> scheduler_pb2.CommitVersionResponse:
        """Commit ``version``; ``step`` and ``mean_reward`` (when given) reach the job's status."""
        request = scheduler_pb2.CommitVersionRequest(version=version, step=step, mean_reward=mean_reward)
        return await status.unary(self._stub.CommitVersion(request), what="scheduler.CommitVersion")

    async def suspend(self) -> scheduler_pb2.SchedulerStats:
        return await status.unary(
            self._stub.Suspend(scheduler_pb2.SuspendRequest()), what="scheduler.Suspend"
        )

    async def resume(self) -> scheduler_pb2.SchedulerStats:
        return await status.unary(self._stub.Resume(scheduler_pb2.ResumeRequest()), what="scheduler.Resume")

    async def stats(self) -> scheduler_pb2.SchedulerStats:
        return await status.unary(
            self._stub.Stats(scheduler_pb2.SchedulerStatsRequest()), what="scheduler.Stats"
        )

    async def list_trajectories(self, limit: int = 0) -> scheduler_pb2.ListTrajectoriesResponse:
        return await status.unary(
            self._stub.ListTrajectories(scheduler_pb2.ListTrajectoriesRequest(limit=limit)),
            what="scheduler.ListTrajectories",
        )

    async def aclose(self) -> None:
        await self._channel.close()
