"""The scheduler's agent loop, admission, commits, suspend/resume and failure handling.

Dependencies are in-process: the real ``PlacementService`` and ``BufferService`` (memory store) and
the fakes in ``dataplane_fakes`` for env, agent and reward; retries use zero backoff, so nothing
sleeps. The same paths over real services on 127.0.0.1 are in tests/integration/dataplane.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import dataplane_fakes as fakes
import pytest
import yaml

from treadle import errors
from treadle.api import jobconfig, v1alpha1
from treadle.policy.heddle import predictor
from treadle.services.buffer import protocol as buffer_protocol
from treadle.services.buffer import service as buffer_service
from treadle.services.buffer import store
from treadle.services.placement import service as placement_service
from treadle.services.reward import protocol as reward_protocol
from treadle.services.scheduler import admission, grpc_server, journal, protocol, service
from treadle.v1 import common_pb2, placement_pb2, scheduler_pb2

EXAMPLES = Path(__file__).resolve().parents[3] / "manifests" / "examples"
TASK = jobconfig.TaskConfig(name="math", env="math-tool", group_size=4, max_turns=3)


class Stack:
    def __init__(
        self,
        *,
        env: fakes.Env | None = None,
        reward: fakes.Reward | None = None,
        clock: Callable[[], float] = time.monotonic,
        journal_: journal.Journal | None = None,
        **settings: object,
    ):
        self.env = env or fakes.Env()
        self.agent = fakes.Agent()
        self.reward = reward or fakes.Reward()
        self.placement = placement_service.PlacementService(
            pools={"decode": "decode-heavy"}, tasks={"math": jobconfig.TaskPlacement("decode-heavy")}
        )
        for i in range(2):
            self.placement.register_worker(
                placement_pb2.Worker(worker_id=f"w{i}", pool="decode", address=f"a{i}")
            )
        self.buffer = buffer_service.BufferService(store=store.MemoryStore(), alpha=1)
        defaults: dict[str, object] = {"alpha": 1, "batch_size": 8, "max_in_flight": 64, "backoff_s": 0.0}
        self.svc = service.SchedulerService(
            tasks={"math": TASK},
            settings=jobconfig.Settings(**{**defaults, **settings}),  # type: ignore[arg-type]
            envs=[self.env],
            agent_for=lambda address: self.agent,
            placement=placement_service.InProcess(self.placement),
            reward=self.reward,
            buffer=self.buffer,
            clock=clock,
            journal_=journal_,
        )

    async def submit(self, *group_ids: str) -> None:
        groups = [protocol.PromptGroup(group_id=g, task="math", seed=i) for i, g in enumerate(group_ids)]
        await self.svc.submit(groups)

    async def collect(self, n: int, results: AsyncIterator[protocol.TrajectoryResult]) -> list[str]:
        out = []
        async with asyncio.timeout(10):
            async for r in results:
                out.append(f"{r.trajectory_id}:{r.status}")
                if len(out) == n:
                    break
        return sorted(out)


def adds_up(s: protocol.Stats) -> bool:
    return s.submitted == s.pending + s.in_flight + s.unsaved + s.completed + s.failed + s.aborted


async def test_trajectories_complete_and_land_in_the_buffer() -> None:
    st = Stack()
    results = st.svc.results()
    await st.submit("g1", "g2")
    done = await st.collect(8, results)
    assert done == sorted(f"{g}-{i}:completed" for g in ("g1", "g2") for i in range(4))
    stats = st.svc.stats()
    assert (stats.completed, stats.turns, stats.in_flight, stats.pending) == (8, 16, 0, 0)  # 2 steps each
    assert adds_up(stats)
    assert set(stats.stage_seconds) == {"generation", "environment", "reward", "waiting"}
    batch = await st.buffer.get_batch(batch_size=8, version=0, timeout_s=0)
    t = batch.trajectories[0]
    assert (t.group_size, t.status, t.reward, len(t.turns)) == (4, "completed", 1.0, 2)
    assert list(t.turns[0].output_token_ids) == [7, 8] and list(t.turns[0].output_versions) == [0, 0]
    assert t.turns[0].observation == "obs 1" and t.prompt.startswith("task ")
    assert sorted(st.env.closed) == sorted(f"{g}-{i}" for g in ("g1", "g2") for i in range(4))
    # every sticky entry was forgotten at the end of its trajectory
    assert all(w.sticky_trajectories == 0 and w.outstanding == 0 for w in st.placement.pool_state().workers)
    await st.svc.aclose()


async def test_admission_waits_for_the_version_and_commit_aborts_stale() -> None:
    # alpha 0, batch 4: one group of 4 may start per version
    st = Stack(alpha=0, batch_size=4)
    st.agent.hold = asyncio.Event()
    results = st.svc.results()
    await st.submit("g1", "g2")
    stats = st.svc.stats()
    assert (stats.in_flight, stats.pending) == (4, 4)
    reply = await st.svc.commit_version(1)  # g1 was initiated at 0 < 1 - 0: aborted
    assert list(reply.aborted_trajectory_ids) == [f"g1-{i}" for i in range(4)]
    done = await st.collect(4, results)
    assert done == [f"g1-{i}:aborted" for i in range(4)]
    stats = st.svc.stats()
    assert (stats.in_flight, stats.pending, stats.aborted) == (4, 0, 4)  # g2 admitted under version 1
    st.agent.hold.set()
    assert await st.collect(4, results) == [f"g2-{i}:completed" for i in range(4)]
    assert adds_up(st.svc.stats())
    with pytest.raises(errors.Conflict):
        await st.svc.commit_version(0)
    await st.svc.aclose()


async def test_a_commit_records_the_trainers_step_and_reward_for_the_jobs_status() -> None:
    st = Stack()
    servicer = grpc_server.SchedulerServicer(st.svc)
    assert st.svc.progress == protocol.Progress(version=0, step=0, mean_reward=None)
    request = scheduler_pb2.CommitVersionRequest(version=1, step=1, mean_reward=0.25)
    await servicer.CommitVersion(request, None)
    assert st.svc.progress == protocol.Progress(version=1, step=1, mean_reward=0.25)
    # A trainer that says no reward (the field unset, not 0.0) leaves the reward unknown.
    await servicer.CommitVersion(scheduler_pb2.CommitVersionRequest(version=2, step=2), None)
    assert st.svc.progress == protocol.Progress(version=2, step=2, mean_reward=None)
    for bad, field in (({"step": -1}, "step"), ({"mean_reward": float("nan")}, "mean_reward")):
        with pytest.raises(errors.SpecError) as info:
            await st.svc.commit_version(3, **bad)  # type: ignore[arg-type]
        assert info.value.field == field
    assert (st.svc.version, st.svc.progress.version) == (2, 2)  # a refused commit changes nothing
    await st.svc.aclose()


async def test_env_failures_are_retried_then_fail_with_reason() -> None:
    st = Stack(env=fakes.Env(fail_open=2), env_attempts=4)
    results = st.svc.results()
    await st.submit("g1")
    assert await st.collect(4, results) == [f"g1-{i}:completed" for i in range(4)]
    assert st.svc.stats().env_retries == 2

    broken = Stack(env=fakes.Env(fail_step=1000), env_attempts=3)
    results = broken.svc.results()
    await broken.submit("g1")
    assert await broken.collect(4, results) == [f"g1-{i}:failed" for i in range(4)]
    stats = broken.svc.stats()
    assert dict(stats.failed_by_reason) == {"environment: step failed after 3 attempts": 4}
    # a step unreachable is a session lost with its env server: each ran again from its start twice
    assert broken.env.calls == 4 * (1 + admission.MAX_RESTARTS) * (1 + 3)
    assert adds_up(stats)
    batch = await broken.buffer.stats()
    assert (batch.failed, batch.retired_empty_groups) == (4, 0)  # stored with the reason, never lost
    await st.svc.aclose()
    await broken.svc.aclose()


async def test_a_trajectory_whose_env_server_went_away_runs_again_from_its_start() -> None:
    """An env pod deleted mid-run: every step to it fails (Unavailable) and its sessions are gone.
    The trajectories on it run again from their start on the pool as it is now, under the same ids,
    and complete: nothing failed, nothing stored twice, the accounting adds up."""
    st = Stack(env=fakes.Env(fail_step=2), env_attempts=1)  # two trajectories lose their session
    results = st.svc.results()
    await st.submit("g1")
    assert sorted(await st.collect(4, results)) == [f"g1-{i}:completed" for i in range(4)]
    stats = st.svc.stats()
    assert (stats.failed, stats.completed) == (0, 4) and adds_up(stats)
    assert st.env.calls == 4 * 3 + 2 * 2  # open and two steps each, and the two lost runs (open, step)
    batch = await st.buffer.get_batch(batch_size=4, version=0, timeout_s=0)
    assert sorted(t.trajectory_id for t in batch.trajectories) == [f"g1-{i}" for i in range(4)]
    await st.svc.aclose()


async def test_non_retryable_env_error_fails_at_once() -> None:
    st = Stack(env=fakes.Env(step_error=errors.SpecError("bad action", field="action")))
    results = st.svc.results()
    await st.submit("g1")
    assert await st.collect(4, results) == [f"g1-{i}:failed" for i in range(4)]
    assert st.env.calls == 8  # one open and one step each, no retry, no run again
    assert dict(st.svc.stats().failed_by_reason) == {"environment: step": 4}
    await st.svc.aclose()


async def test_a_session_the_env_server_no_longer_knows_runs_again_then_fails_with_reason() -> None:
    """NotFound on a step: the server was restarted under the session (same address, state gone)."""
    st = Stack(env=fakes.Env(step_error=errors.NotFound("session gone")))
    results = st.svc.results()
    await st.submit("g1")
    assert await st.collect(4, results) == [f"g1-{i}:failed" for i in range(4)]
    assert st.env.calls == 4 * 2 * (1 + admission.MAX_RESTARTS)  # each run: one open, one step
    assert dict(st.svc.stats().failed_by_reason) == {"environment: step": 4}
    await st.svc.aclose()


async def test_reward_failure_is_retried() -> None:
    st = Stack(reward=fakes.Reward(fail=3), reward_attempts=4)
    results = st.svc.results()
    await st.submit("g1")
    assert await st.collect(4, results) == [f"g1-{i}:completed" for i in range(4)]
    await st.svc.aclose()


class ColdReward(fakes.Reward):
    """A gateway scaled to zero: ``Unavailable`` for ``fail`` calls, each taking ``seconds`` of the clock."""

    def __init__(self, *, fail: int, seconds: float) -> None:
        super().__init__(fail=fail)
        self.now = 0.0
        self.seconds = seconds

    def clock(self) -> float:
        return self.now

    async def score(self, req: reward_protocol.ScoreRequest) -> reward_protocol.ScoreResult:
        self.now += self.seconds
        return await super().score(req)


async def test_reward_unavailable_is_waited_out_within_the_budget() -> None:
    # 40 refusals of 1 s each, shared by 4 trajectories: far beyond reward_attempts, within 60 s.
    reward = ColdReward(fail=40, seconds=1.0)
    st = Stack(reward=reward, clock=reward.clock, reward_attempts=4, reward_unavailable_s=60.0)
    results = st.svc.results()
    await st.submit("g1")
    assert await st.collect(4, results) == [f"g1-{i}:completed" for i in range(4)]
    await st.svc.aclose()


async def test_reward_unavailable_past_the_budget_fails_with_the_reason() -> None:
    reward = ColdReward(fail=1_000_000, seconds=1.0)
    st = Stack(reward=reward, clock=reward.clock, reward_attempts=4, reward_unavailable_s=60.0)
    results = st.svc.results()
    await st.submit("g1")
    reasons = []
    async with asyncio.timeout(10):
        async for r in results:
            assert r.status == "failed"
            reasons.append(r.reason)
            if len(reasons) == 4:
                break
    assert all(r.startswith("reward: score: unavailable for 6") for r in reasons), reasons
    assert all("more than reward_unavailable_s=60: reward down" in r for r in reasons), reasons
    assert reward.now < 4 * 70  # gave up soon after the budget, not after some count of attempts
    assert dict(st.svc.stats().failed_by_reason) == {"reward: score": 4}
    await st.svc.aclose()


async def test_reward_unavailable_without_a_budget_fails_after_the_attempts() -> None:
    reward = ColdReward(fail=1_000_000, seconds=1.0)
    st = Stack(reward=reward, clock=reward.clock, reward_attempts=4)
    results = st.svc.results()
    await st.submit("g1")
    assert await st.collect(4, results) == [f"g1-{i}:failed" for i in range(4)]
    assert 1_000_000 - reward.fail == 16  # 4 attempts per trajectory, however little time passed
    await st.svc.aclose()


async def test_worker_abort_reissues_the_turn() -> None:
    st = Stack()
    st.agent.abort_next = 2
    results = st.svc.results()
    await st.submit("g1")
    assert await st.collect(4, results) == [f"g1-{i}:completed" for i in range(4)]
    assert st.svc.stats().turns == 8 and st.agent.started == 10
    await st.svc.aclose()


async def test_suspend_holds_admission_and_turns() -> None:
    st = Stack()
    st.svc.suspend()
    results = st.svc.results()
    await st.submit("g1")
    stats = st.svc.stats()
    assert (stats.suspended, stats.in_flight, stats.pending) == (True, 0, 4)
    st.svc.resume()
    assert await st.collect(4, results) == [f"g1-{i}:completed" for i in range(4)]
    await st.svc.aclose()


@pytest.mark.parametrize(
    ("group", "field"),
    [
        (protocol.PromptGroup(group_id="g", task="nope"), "groups[1].task"),
        (protocol.PromptGroup(group_id="bad id!", task="math"), "groups[1].group_id"),
        (protocol.PromptGroup(group_id="g", task="math", seed=-1), "groups[1].seed"),
        (protocol.PromptGroup(group_id="g", task="math", options_json="[1]"), "groups[1].options_json"),
        (protocol.PromptGroup(group_id="g", task="math", options_json="{"), "groups[1].options_json"),
    ],
    ids=["unknown-task", "bad-group-id", "negative-seed", "options-not-object", "options-not-json"],
)
async def test_bad_submit_names_the_field_and_queues_nothing(group: protocol.PromptGroup, field: str) -> None:
    st = Stack()
    with pytest.raises(errors.SpecError) as err:
        await st.svc.submit([protocol.PromptGroup(group_id="ok", task="math"), group])
    assert err.value.field == field
    assert (st.svc.stats().submitted, st.svc.stats().pending) == (0, 0)


async def test_backpressure_and_idempotent_submit() -> None:
    st = Stack(max_pending_trajectories=4)
    st.svc.suspend()
    await st.submit("g1")
    await st.submit("g1")  # a repeated group is accepted once
    assert st.svc.stats().submitted == 4
    with pytest.raises(errors.Overloaded):
        await st.submit("g2")
    await st.svc.aclose()


class FlakyBuffer:
    """The first ``fail`` puts raise Unavailable, then it passes through."""

    def __init__(self, inner: buffer_service.BufferService, fail: int) -> None:
        self.inner, self.fail = inner, fail

    async def put(self, trajectories: Sequence[common_pb2.Trajectory]) -> buffer_protocol.PutResult:
        if self.fail > 0:
            self.fail -= 1
            raise errors.Unavailable("buffer down")
        return await self.inner.put(trajectories)


async def test_buffer_outage_keeps_trajectories_unsaved_until_it_returns() -> None:
    st = Stack()
    st.svc.buffer = FlakyBuffer(st.buffer, fail=3)
    results = st.svc.results()
    await st.submit("g1")
    assert await st.collect(4, results) == [f"g1-{i}:completed" for i in range(4)]
    assert (await st.buffer.stats()).put == 4
    assert adds_up(st.svc.stats())
    await st.svc.aclose()


async def test_trajectory_the_buffer_refuses_is_stored_as_failed_with_the_reason() -> None:
    st = Stack()
    st.agent.pad = 200
    st.buffer.max_trajectory_bytes = 300  # two turns of 200+ characters do not fit; a stub does
    results = st.svc.results()
    await st.submit("g1")
    assert await st.collect(4, results) == [f"g1-{i}:failed" for i in range(4)]
    stats = st.svc.stats()
    assert dict(stats.failed_by_reason) == {"buffer: refused": 4} and adds_up(stats)
    stored = await st.buffer.stats()
    assert (stored.put, stored.failed) == (4, 4)
    await st.svc.aclose()


class HeldReward(fakes.Reward):
    """Scores only once ``hold`` is set, so trajectories pile up in reward scoring."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = asyncio.Event()
        self.four_waiting = asyncio.Event()
        self.waiting = 0

    async def score(self, req: Any) -> Any:
        self.waiting += 1
        if self.waiting == 4:
            self.four_waiting.set()
        await self.hold.wait()
        return await super().score(req)


async def test_reward_backlog_counts_trajectories_in_scoring() -> None:
    reward = HeldReward()
    st = Stack(reward=reward)
    results = st.svc.results()
    assert st.svc.reward_backlog() == 0
    await st.submit("g1")
    async with asyncio.timeout(10):
        await reward.four_waiting.wait()
    assert st.svc.reward_backlog() == 4
    reward.hold.set()
    assert await st.collect(4, results) == [f"g1-{i}:completed" for i in range(4)]
    assert st.svc.reward_backlog() == 0
    await st.svc.aclose()


async def test_sync_admission_with_a_batch_not_a_multiple_of_the_group_completes() -> None:
    # issue #4: alpha 0, batch 6, groups of 4 -> the buffer's batch is two whole groups; both start
    # under version 0 (before the fix only one did, and no batch of 6 could ever form).
    st = Stack(alpha=0, batch_size=6)
    results = st.svc.results()
    await st.submit("g1", "g2", "g3")
    stats = st.svc.stats()
    assert (stats.in_flight, stats.pending) == (8, 4)
    assert len(await st.collect(8, results)) == 8
    batch = await st.buffer.get_batch(batch_size=6, version=0, timeout_s=0)
    assert len(batch.trajectories) == 8
    await st.svc.commit_version(1)
    assert await st.collect(4, results) == [f"g3-{i}:completed" for i in range(4)]
    await st.svc.aclose()


async def test_list_trajectories_exposes_rank_prediction_and_worker() -> None:
    st = Stack(scheduling_policy="heddle")
    st.agent.hold = asyncio.Event()
    await st.submit("g1")
    for _ in range(100):  # bounded: each trajectory needs a few loop turns to reach generate
        if st.agent.started == 4:
            break
        await asyncio.sleep(0)
    listed = st.svc.list_trajectories()
    assert listed.total == 4
    assert [t.rank for t in listed.trajectories] == [0, 1, 2, 3]
    assert {t.state for t in listed.trajectories} == {"generating"}
    assert all(t.worker_id in {"w0", "w1"} and t.predicted_remaining == 0.0 for t in listed.trajectories)
    assert len(st.svc.list_trajectories(limit=2).trajectories) == 2
    with pytest.raises(errors.SpecError) as err:
        st.svc.list_trajectories(limit=-1)
    assert err.value.field == "limit"
    st.agent.hold.set()
    await st.svc.aclose()


async def test_predictor_learns_from_completed_trajectories() -> None:
    st = Stack(scheduling_policy="heddle")
    results = st.svc.results()
    await st.submit("g1", "g2")
    await st.collect(8, results)
    model = st.svc.models["math"]
    assert "math" in model.tasks  # learned: each trajectory had 2 turns of 2 tokens
    after_one = predictor.Observation(task="math", group_id="new", tokens_so_far=2, steps_done=1)
    assert model.predict(after_one) == pytest.approx(2.0)
    assert st.svc.stats().preemptions == 0
    await st.svc.aclose()


async def test_per_worker_slots_assign_before_waiting_and_complete() -> None:
    st = Stack(scheduling_policy="heddle", worker_slots=1)
    results = st.svc.results()
    await st.submit("g1", "g2")
    assert len(await st.collect(8, results)) == 8
    assert st.svc.stats().completed == 8
    # every assigned turn was released, including those assigned while they waited
    assert all(w.outstanding == 0 for w in st.placement.pool_state().workers)
    await st.svc.aclose()


async def test_heddle_scheduling_preempts_through_the_agent_abort() -> None:
    st = Stack(scheduling_policy="heddle", max_concurrent_generations=1)
    # history of the same prompts (seed 0 is g1's, seed 5 g2's): g1's ran short (4 tokens), g2's long
    # (1000), so g2's members now outrank g1's
    st.svc.models["math"] = predictor.learn(
        st.svc.models["math"],
        [predictor.Finished("math", "0:", 4, (2, 2)), predictor.Finished("math", "5:", 1000, (500, 500))],
    )
    st.agent.hold = asyncio.Event()
    results = st.svc.results()
    await st.submit("g1")
    for _ in range(200):  # bounded: g1-0 reaches the agent within a few loop turns
        if st.agent.started:
            break
        await asyncio.sleep(0)
    await st.svc.submit([protocol.PromptGroup(group_id="g2", task="math", seed=5)])
    for _ in range(200):
        if st.agent.aborted:
            break
        await asyncio.sleep(0)
    assert st.agent.aborted == ["g1-0"]  # the running, lower-ranked turn was ABORTed for a g2 turn
    ranks = {t.trajectory_id: t.rank for t in st.svc.list_trajectories().trajectories}
    assert max(ranks[f"g2-{i}"] for i in range(4)) < min(ranks[f"g1-{i}"] for i in range(4))
    st.agent.hold.set()
    assert len(await st.collect(8, results)) == 8
    assert st.svc.stats().preemptions == 1
    await st.svc.aclose()


class RewardingEnv(fakes.Env):
    """Ends with the environment's own reward (FrozenLake-style)."""

    async def step(self, session_id: str, action: str) -> Any:
        result = await super().step(session_id, action)
        return result.model_copy(update={"reward": 0.5}) if result.done else result


class RecordingReward(fakes.Reward):
    def __init__(self) -> None:
        super().__init__()
        self.metadata: list[dict[str, Any]] = []

    async def score(self, req: Any) -> Any:
        self.metadata.append(dict(req.metadata))
        return await super().score(req)


async def test_environment_reward_goes_to_the_gateway_as_metadata() -> None:
    reward = RecordingReward()
    st = Stack(env=RewardingEnv(), reward=reward)
    results = st.svc.results()
    await st.submit("g1")
    await st.collect(4, results)
    assert [m["env_reward"] for m in reward.metadata] == [0.5] * 4
    await st.svc.aclose()


def test_job_config_waits_for_a_reward_gateway_that_scales_to_zero() -> None:
    raw = yaml.safe_load((EXAMPLES / "math-tool-h20.yaml").read_text())
    job = v1alpha1.parse_job(raw)
    counts = {"max_tokens": 128, "max_in_flight": 256, "max_concurrent_generations": 512}
    assert job.spec.reward.scale_to_zero
    assert (
        jobconfig.job_config(job, **counts).scheduler.settings.reward_unavailable_s
        == jobconfig.REWARD_COLD_START_S
    )
    raw["spec"]["reward"] = {**raw["spec"].get("reward", {}), "scaleToZero": False, "minReplicas": 1}
    warm = jobconfig.job_config(v1alpha1.parse_job(raw), **counts)
    # an always-on gateway is waited for while a replacement of its pod starts, not a cold start's time
    assert warm.scheduler.settings.reward_unavailable_s == jobconfig.REWARD_RESTART_S


class _Gone:
    """The agent of a deleted inference pod: every call refused; its placement worker reports unhealthy
    from the first refusal on (as placement marks a silent worker lost)."""

    def __init__(self, placement: placement_service.PlacementService) -> None:
        self.placement, self.calls = placement, 0

    async def generate(self, req: Any) -> Any:
        self.calls += 1
        self.placement.report_load(placement_pb2.WorkerLoad(worker_id="w0", healthy=False))
        raise errors.Unavailable("POST http://a0/v1/generate: connection refused")

    async def abort(self, trajectory_id: str) -> bool:
        return False


async def test_a_turn_whose_worker_is_gone_is_assigned_again_instead_of_failing() -> None:
    st = Stack(generation_attempts=2)
    gone = _Gone(st.placement)
    st.svc.loop.agent_for = lambda address: gone if address == "a0" else st.agent
    results = st.svc.results()
    await st.submit("g1", "g2")
    assert await st.collect(8, results) == sorted(
        f"{g}-{i}:completed" for g in ("g1", "g2") for i in range(4)
    )
    assert gone.calls >= 2  # some turns met the gone worker, each tried twice before moving to w1
    assert all(w.outstanding == 0 for w in st.placement.pool_state().workers)
    await st.svc.aclose()
