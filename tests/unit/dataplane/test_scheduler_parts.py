"""Each part of the scheduler alone: admission's queue, retries with backoff, the reward stage and the
save stage (the gate's tests are in test_scheduler, beside the service's; the whole loop too).

In-process and deterministic: a fake clock where time matters, zero backoff, the memory buffer.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence

import dataplane_fakes as fakes
import prometheus_client as prom
import pytest

from treadle import errors
from treadle.api import jobconfig
from treadle.services.buffer import protocol as buffer_protocol
from treadle.services.scheduler import admission, protocol, retry, saver, scoring, stats, trajectory
from treadle.v1 import common_pb2

TASK = jobconfig.TaskConfig(name="math", env="e", group_size=4, reward_fn="exact")
DUO = jobconfig.TaskConfig(name="duo", env="e", agent="a", agents=("a", "b"), group_size=1)
SETTINGS = jobconfig.Settings(alpha=0, batch_size=8, max_in_flight=64, backoff_s=0.0, env_attempts=3)


def _traj(task: jobconfig.TaskConfig = TASK) -> trajectory.Traj:
    return trajectory.Traj(tid="g-0", work=protocol.Work("g", task, 0, None), init_version=0)


def _tally() -> stats.Tally:
    return stats.Tally(["math", "duo"], stats.SchedulerMetrics(prom.CollectorRegistry()))


def _groups(*ids: str) -> list[protocol.PromptGroup]:
    return [protocol.PromptGroup(group_id=g, task="math", seed=1) for g in ids]


# --- admission --------------------------------------------------------------------------------------


def test_admission_takes_whole_groups_within_the_version_bound_in_order() -> None:
    queue = admission.Admission({"math": TASK}, SETTINGS)
    assert [w.group_id for w in queue.submit(_groups("a", "b", "c"))] == ["a", "b", "c"]
    assert queue.pending_trajectories == 12
    # alpha 0, version 0: (0 + 0 + 1) * 8 trajectories may start, so two groups of four.
    assert [w.group_id for w in queue.take(version=0, accepted=0, running=0)] == ["a", "b"]
    assert queue.take(version=0, accepted=0, running=8) == []
    assert [w.group_id for w in queue.take(version=1, accepted=8, running=0)] == ["c"]
    assert queue.pending_trajectories == 0


def test_admission_ignores_repeated_groups_and_refuses_overload_whole() -> None:
    queue = admission.Admission({"math": TASK}, jobconfig.Settings(max_pending_trajectories=8))
    queue.submit(_groups("a"))
    assert queue.submit(_groups("a", "b")) and queue.pending_trajectories == 8
    with pytest.raises(errors.Overloaded, match="max_pending_trajectories=8"):
        queue.submit(_groups("c"))
    with pytest.raises(errors.SpecError, match=r"groups\[0\].task"):
        queue.submit([protocol.PromptGroup(group_id="d", task="nope")])
    assert queue.pending_trajectories == 8


# --- retries ----------------------------------------------------------------------------------------


class _Flaky:
    def __init__(self, failures: Sequence[Exception]) -> None:
        self.failures = list(failures)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "ok"


async def test_retry_backs_off_until_success_and_counts_env_retries() -> None:
    tally, t = _tally(), _traj()
    flaky = _Flaky([errors.Unavailable("down"), TimeoutError()])
    assert (
        await retry.Retrier(SETTINGS, tally, clock=itertools.count().__next__).call(
            t, "environment", "open", flaky
        )
        == "ok"
    )
    assert flaky.calls == 3 and tally.env_retries == 2
    assert t.stage["environment"] == 3  # one tick of the fake clock per call


async def test_retry_fails_with_the_reason_after_the_last_attempt_or_a_hard_error() -> None:
    retrier = retry.Retrier(SETTINGS, _tally(), clock=lambda: 0.0)
    flaky = _Flaky([errors.Unavailable("down")] * 5)
    with pytest.raises(trajectory.Failed, match="environment: step failed after 3 attempts: down"):
        await retrier.call(_traj(), "environment", "step", flaky)
    assert flaky.calls == 3
    with pytest.raises(trajectory.Failed, match="generation: generate on w0: bad"):
        await retrier.call(_traj(), "generation", "generate on w0", _Flaky([errors.Conflict("bad")]))


async def test_retry_waits_out_an_unavailable_reward_gateway_for_its_budget() -> None:
    ticks = itertools.count()
    settings = jobconfig.Settings(backoff_s=0.0, reward_attempts=2, reward_unavailable_s=10.0)
    retrier = retry.Retrier(settings, _tally(), clock=lambda: float(next(ticks)))
    flaky = _Flaky([errors.Unavailable("scaled to zero")] * 3)  # more than reward_attempts
    assert await retrier.call(_traj(), "reward", "score", flaky) == "ok"
    forever = _Flaky([errors.Unavailable("gone")] * 100)
    with pytest.raises(trajectory.Failed, match="more than reward_unavailable_s=10"):
        await retrier.call(_traj(), "reward", "score", forever)
    assert forever.calls < 100


async def test_retry_waits_out_an_env_pool_not_ready_on_open_but_not_on_step() -> None:
    """Found on the dev cluster: the feeder's first groups failed while the env pod was starting."""
    ticks = itertools.count()
    settings = jobconfig.Settings(backoff_s=0.0, env_attempts=2, env_open_unavailable_s=10.0)
    retrier = retry.Retrier(settings, _tally(), clock=lambda: float(next(ticks)))
    starting = _Flaky([errors.Unavailable("no address")] * 3)  # more than env_attempts
    assert await retrier.call(_traj(), "environment", "open", starting) == "ok"
    with pytest.raises(trajectory.Failed, match="more than env_open_unavailable_s=10"):
        await retrier.call(_traj(), "environment", "open", _Flaky([errors.Unavailable("gone")] * 100))
    with pytest.raises(trajectory.Failed, match="environment: step failed after 2 attempts"):
        await retrier.call(_traj(), "environment", "step", _Flaky([errors.Unavailable("pod gone")] * 3))


async def test_retry_waits_out_placement_without_a_ready_worker_for_its_budget() -> None:
    """Found on the dev cluster: every turn failed while the one vLLM engine was still loading."""
    ticks = itertools.count()
    settings = jobconfig.Settings(backoff_s=0.0, worker_unavailable_s=10.0)
    retrier = retry.Retrier(settings, _tally(), clock=lambda: float(next(ticks)))
    loading = _Flaky([errors.Unavailable("no healthy worker")] * 3)
    assert await retrier.call(_traj(), "placement", "assign", loading, account=False) == "ok"
    with pytest.raises(trajectory.Failed, match="more than worker_unavailable_s=10"):
        await retrier.call(
            _traj(), "placement", "assign", _Flaky([errors.Unavailable("none")] * 100), account=False
        )
    unset = retry.Retrier(jobconfig.Settings(backoff_s=0.0), _tally(), clock=lambda: 0.0)
    with pytest.raises(trajectory.Failed, match="placement: assign failed after 1 attempts"):
        await unset.call(_traj(), "placement", "assign", _Flaky([errors.Unavailable("none")]), account=False)


# --- reward stage -----------------------------------------------------------------------------------


async def test_scoring_sends_the_last_turn_and_the_env_reward() -> None:
    reward = fakes.Reward(fail=1)
    stage = scoring.RewardStage(reward, retry.Retrier(SETTINGS, _tally(), clock=lambda: 0.0))
    t = _traj()
    t.turns.append(common_pb2.Turn(text="42"))
    assert await stage.score(t, {"reference": 42}, "prompt", env_reward=0.5) == 1.0
    assert reward.scored == ["g-0"]


async def test_scoring_fails_a_task_without_a_reward_function() -> None:
    task = jobconfig.TaskConfig(name="math", env="e")
    stage = scoring.RewardStage(fakes.Reward(), retry.Retrier(SETTINGS, _tally(), clock=lambda: 0.0))
    with pytest.raises(trajectory.Failed, match="names no reward function"):
        await stage.score(_traj(task), {}, "p")


# --- save stage -------------------------------------------------------------------------------------


class _Buffer:
    """Refuses any put that holds a trajectory with a prompt (too large, say); fails ``down`` puts first."""

    def __init__(self, down: int = 0) -> None:
        self.down = down
        self.stored: list[common_pb2.Trajectory] = []

    async def put(self, trajectories: Sequence[common_pb2.Trajectory]) -> buffer_protocol.PutResult:
        if self.down > 0:
            self.down -= 1
            raise errors.Unavailable("buffer down")
        if any(t.prompt for t in trajectories):
            raise errors.SpecError("too large", field="trajectories[0]")
        self.stored.extend(trajectories)
        return buffer_protocol.PutResult(stored=len(trajectories), duplicates=0)


def _finished(tid: str, task: str = "math", prompt: str = "") -> saver.Finished:
    turns = [common_pb2.Turn(agent="a"), common_pb2.Turn(agent="b")]
    traj = common_pb2.Trajectory(
        trajectory_id=tid, group_id="g", task=task, status="completed", prompt=prompt, turns=turns
    )
    result = protocol.TrajectoryResult(
        trajectory_id=tid, group_id="g", task=task, status="completed", reason="", reward=1.0, turns=2,
        init_version=0, min_version=0, max_version=0, output_tokens=0, seconds=0.0,
    )  # fmt: skip
    return traj, result


async def _save(buffer: _Buffer, *finished: saver.Finished) -> list[str]:
    saved: list[str] = []
    all_saved = asyncio.Event()

    def on_saved(traj: common_pb2.Trajectory, result: protocol.TrajectoryResult) -> None:
        saved.append(result.status)
        if len(saved) == len(finished):
            all_saved.set()

    tasks = {"math": TASK, "duo": DUO}
    stage = saver.Saver(buffer, settings=SETTINGS, tasks=tasks, on_saved=on_saved)
    for traj, result in finished:
        stage.add(traj, result)
    assert stage.unsaved == len(finished)
    async with asyncio.timeout(5):
        await all_saved.wait()
    assert stage.unsaved == 0
    await stage.aclose()
    return saved


async def test_saver_retries_until_the_buffer_takes_and_splits_agents() -> None:
    buffer = _Buffer(down=2)
    assert await _save(buffer, _finished("t1"), _finished("t2", task="duo")) == ["completed"] * 2
    assert [(t.trajectory_id, t.group_id, len(t.turns)) for t in buffer.stored] == [
        ("t1", "g", 2), ("t2@a", "g@a", 1), ("t2@b", "g@b", 1),
    ]  # fmt: skip


async def test_saver_stores_a_refused_trajectory_as_a_failed_stub() -> None:
    buffer = _Buffer()
    assert await _save(buffer, _finished("t1"), _finished("big", prompt="x" * 10)) == ["completed", "failed"]
    stub = buffer.stored[-1]
    assert (stub.trajectory_id, stub.status, stub.prompt, len(stub.turns)) == ("big", "failed", "", 0)
    assert stub.reason == "buffer: refused: trajectories[0]: too large"
