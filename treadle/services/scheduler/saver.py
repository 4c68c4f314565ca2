"""The save stage of the scheduler: put finished trajectories to the buffer, in batches, until it
takes them.

Fed by ``SchedulerService`` as trajectories finish; calls ``on_saved`` once per trajectory the
buffer stored (or refused even as a stub). A multi-agent trajectory is stored once per agent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping

from treadle import errors
from treadle.api import jobconfig
from treadle.services.scheduler import protocol
from treadle.v1 import common_pb2

log = logging.getLogger(__name__)
REFUSED = "buffer: refused: "
Finished = tuple[common_pb2.Trajectory, protocol.TrajectoryResult]
"""A finished trajectory as stored, and the result its subscribers get once it is."""


class Saver:
    def __init__(
        self,
        buffer: protocol.Buffer,
        *,
        settings: jobconfig.Settings,
        tasks: Mapping[str, jobconfig.TaskConfig],
        on_saved: Callable[[common_pb2.Trajectory, protocol.TrajectoryResult], None],
    ) -> None:
        self.buffer = buffer
        self.settings = settings
        self.tasks = tasks
        self.on_saved = on_saved
        self._unsaved: list[Finished] = []
        self._saving = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def unsaved(self) -> int:
        """Finished trajectories the buffer has not taken yet (queued or in a put)."""
        return len(self._unsaved) + self._saving

    def add(self, traj: common_pb2.Trajectory, result: protocol.TrajectoryResult) -> None:
        self._unsaved.append((traj, result))
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._save_forever(), name="buffer saver")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _save_forever(self) -> None:
        """Put finished trajectories to the buffer in batches; retry until it takes them."""
        delay = self.settings.backoff_s
        while True:
            if not self._unsaved:
                self._wake.clear()
                await self._wake.wait()
            chunk = self._unsaved[: self.settings.buffer_put_max]
            del self._unsaved[: len(chunk)]
            self._saving = len(chunk)
            try:
                await self.buffer.put([r for traj, _ in chunk for r in self._tables(traj)])
            except errors.SpecError as exc:
                # The buffer refuses something in the chunk (too large, say): retrying it cannot help, so
                # put one by one and store what is refused as a failed stub that says why.
                log.warning("buffer refused a put of %d trajectories: %s", len(chunk), exc)
                self._unsaved[:0] = await self._one_by_one(chunk)
                self._saving = 0
                continue
            except errors.TreadleError as exc:
                log.warning(
                    "buffer put of %d trajectories failed (retrying in %.2fs): %s", len(chunk), delay, exc
                )
                self._unsaved[:0] = chunk
                self._saving = 0
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.max_backoff_s)
                continue
            delay = self.settings.backoff_s
            self._saving = 0
            for traj, result in chunk:
                self.on_saved(traj, result)

    async def _one_by_one(self, chunk: list[Finished]) -> list[Finished]:
        """Put each of ``chunk`` alone; return what is to be put again (stubs of the refused ones)."""
        again = []
        for traj, result in chunk:
            try:
                await self.buffer.put(self._tables(traj))
            except errors.SpecError as refused:
                if traj.reason.startswith(REFUSED):
                    # Even the stub is refused: count it here, since storing it cannot succeed.
                    log.error("buffer refused trajectory %s even as a stub: %s", traj.trajectory_id, refused)
                    self.on_saved(traj, result)
                else:
                    again.append(_stub(traj, result, f"{REFUSED}{refused}"))
                continue
            except errors.TreadleError:
                again.append((traj, result))
                continue
            self.on_saved(traj, result)
        return again

    def _tables(self, traj: common_pb2.Trajectory) -> list[common_pb2.Trajectory]:
        """What the buffer stores for ``traj``: itself, or one record per agent of a multi-agent task."""
        agents = self.tasks[traj.task].agents
        return [_agent_record(traj, a) for a in agents] if agents else [traj]


def _stub(
    traj: common_pb2.Trajectory, result: protocol.TrajectoryResult, reason: str
) -> tuple[common_pb2.Trajectory, protocol.TrajectoryResult]:
    """``traj`` as a failed record without turns or prompt, so the buffer can take it."""
    stub = common_pb2.Trajectory()
    stub.CopyFrom(traj)
    del stub.turns[:]
    stub.prompt = ""
    stub.status, stub.reason = "failed", reason
    return stub, dataclasses.replace(result, status="failed", reason=reason)


def _agent_record(traj: common_pb2.Trajectory, agent: str) -> common_pb2.Trajectory:
    """``agent``'s row of a multi-agent trajectory: its own turns, the shared reward and status."""
    out = common_pb2.Trajectory()
    out.CopyFrom(traj)
    out.trajectory_id, out.group_id, out.agent = (
        f"{traj.trajectory_id}@{agent}",
        f"{traj.group_id}@{agent}",
        agent,
    )
    del out.turns[:]
    out.turns.extend(turn for turn in traj.turns if turn.agent == agent)
    versions = [v for turn in out.turns for v in turn.output_versions] or [traj.init_version]
    out.min_version, out.max_version = min(versions), max(versions)
    return out
