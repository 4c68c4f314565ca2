"""One suite, both buffer backends: the embedded memory store and Redis (real redis-server).

Every test drives ``BufferService`` over a store, so the semantics checked here (whole groups,
eviction beyond alpha, at-least-once with lease and ack, idempotent put, all-or-nothing validation,
per-task weights, micro-batches) are those of the buffer in local mode and in cluster mode alike.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from treadle import errors
from treadle.errors import NotFound, SpecError
from treadle.services.buffer import redis_store, service, store
from treadle.testing import procs
from treadle.testing import redis_server as redis_server_mod
from treadle.v1 import buffer_pb2, common_pb2


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "redis"])
async def backend(
    request: pytest.FixtureRequest, redis_server: redis_server_mod.RedisServer
) -> AsyncIterator[store.Store]:
    if request.param == "memory":
        yield store.MemoryStore()
        return
    # A fresh namespace per test keeps tests apart without flushing a shared server.
    s = redis_store.RedisStore.from_url(redis_server.url, namespace=uuid.uuid4().hex)
    try:
        yield s
    finally:
        await s.aclose()


def traj(
    tid: str,
    gid: str,
    *,
    task: str = "math",
    size: int = 2,
    version: int = 0,
    status: str = "completed",
    reason: str = "",
    reward: float = 1.0,
    agent: str = "",
) -> common_pb2.Trajectory:
    t = common_pb2.Trajectory(
        trajectory_id=tid,
        group_id=gid,
        task=task,
        agent=agent,
        group_size=size,
        init_version=version,
        status=status,
        reason=reason,
        reward=reward,
        min_version=version,
        max_version=version,
    )
    t.turns.add(output_token_ids=[1, 2], output_logprobs=[-0.1, -0.2], output_versions=[version] * 2)
    return t


def group(gid: str, n: int = 2, **kw: object) -> list[common_pb2.Trajectory]:
    return [traj(f"{gid}-{i}", gid, size=n, **kw) for i in range(n)]  # type: ignore[arg-type]


def make(backend: store.Store, clock: Clock | None = None, **kw: object) -> service.BufferService:
    return service.BufferService(store=backend, alpha=1, clock=clock or Clock(), **kw)  # type: ignore[arg-type]


async def test_whole_groups_oldest_first_then_ack(backend: store.Store) -> None:
    svc = make(backend)
    await svc.put([*group("g1"), traj("g2-0", "g2"), *group("g3")])
    batch = await svc.get_batch(batch_size=4, version=0, timeout_s=0)
    assert list(batch.group_ids) == ["g1", "g3"]  # g2 is missing a member
    assert sorted(t.trajectory_id for t in batch.trajectories) == ["g1-0", "g1-1", "g3-0", "g3-1"]
    assert batch.trajectories[0].turns[0].output_logprobs == pytest.approx([-0.1, -0.2])
    assert await svc.ack(batch.batch_id) == 4
    stats = await svc.stats()
    assert (stats.stored, stats.put, stats.delivered, stats.acked) == (1, 5, 4, 4)
    with pytest.raises(NotFound):
        await svc.ack(batch.batch_id)


async def test_blocks_until_timeout_when_not_enough(backend: store.Store) -> None:
    svc = make(backend)
    await svc.put(group("g1"))
    with pytest.raises(TimeoutError):
        await svc.get_batch(batch_size=4, version=0, timeout_s=0.05)
    assert (await svc.stats()).stored == 2  # nothing was taken


async def test_evicts_groups_older_than_alpha(backend: store.Store) -> None:
    svc = make(backend)
    await svc.put([*group("old", version=0), *group("new", version=2)])
    batch = await svc.get_batch(batch_size=2, version=2, timeout_s=0)
    assert list(batch.group_ids) == ["new"]
    assert batch.evicted_groups == 1
    stats = await svc.stats()
    assert stats.evicted == 2
    # a late member of an evicted group is counted as evicted, not stored
    put = await svc.put([traj("old-9", "old", size=3)])
    assert (put.stored, put.duplicates) == (0, 0)
    assert (await svc.stats()).evicted == 3


async def test_lease_expiry_redelivers_what_a_dead_trainer_held(backend: store.Store) -> None:
    clock = Clock()
    svc = make(backend, clock)
    await svc.put(group("g1"))
    first = await svc.get_batch(batch_size=2, version=0, timeout_s=0, lease_s=10)
    with pytest.raises(TimeoutError):  # leased: not delivered twice while the lease holds
        await svc.get_batch(batch_size=2, version=0, timeout_s=0)
    clock.now += 11  # the trainer died; its lease ran out
    second = await svc.get_batch(batch_size=2, version=0, timeout_s=0)
    assert list(second.group_ids) == ["g1"] and second.batch_id != first.batch_id
    with pytest.raises(NotFound):
        await svc.ack(first.batch_id)  # the expired lease cannot be acked any more
    assert await svc.ack(second.batch_id) == 2
    stats = await svc.stats()
    assert (stats.redelivered, stats.acked, stats.stored) == (2, 2, 0)


async def test_put_is_idempotent(backend: store.Store) -> None:
    svc = make(backend)
    first = await svc.put(group("g1"))
    again = await svc.put(group("g1"))
    assert (first.stored, first.duplicates, again.stored, again.duplicates) == (2, 0, 0, 2)
    assert (await svc.stats()).stored == 2


async def test_failed_members_complete_the_group_but_are_not_delivered(backend: store.Store) -> None:
    svc = make(backend)
    await svc.put([traj("a-0", "a"), traj("a-1", "a", status="failed", reason="env: unavailable")])
    await svc.put([traj(f"b-{i}", "b", status="aborted", reason="stale") for i in range(2)])
    batch = await svc.get_batch(batch_size=1, version=0, timeout_s=0)
    assert [t.trajectory_id for t in batch.trajectories] == ["a-0"]
    stats = await svc.stats()
    assert stats.failed_by_reason == {"env: unavailable": 1, "stale": 2}
    # b had nothing to train on: retired while forming the batch, its trajectories gone
    assert (stats.completed, stats.failed, stats.aborted, stats.retired_empty_groups) == (1, 1, 2, 1)
    assert stats.stored == 2


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (traj("", "g"), "trajectories[1].trajectory_id"),
        (traj("x", ""), "trajectories[1].group_id"),
        (traj("x", "g", size=0), "trajectories[1].group_size"),
        (traj("x", "g", status="done"), "trajectories[1].status"),
        (traj("x", "g", status="failed"), "trajectories[1].reason"),
        (traj("x", "g", version=-1), "trajectories[1].init_version"),
        (traj("x", "g1", task="code"), "trajectories[1]"),  # disagrees with g1 earlier in the request
    ],
    ids=["no-id", "no-group", "size-0", "bad-status", "no-reason", "negative-version", "group-disagrees"],
)
async def test_bad_put_names_the_field_and_stores_nothing(
    backend: store.Store, bad: common_pb2.Trajectory, field: str
) -> None:
    svc = make(backend)
    with pytest.raises(SpecError) as err:
        await svc.put([traj("ok", "g1"), bad])
    assert err.value.field == field
    stats = await svc.stats()
    assert (stats.stored, stats.put) == (0, 0)


async def test_conflict_with_stored_group_stores_nothing(backend: store.Store) -> None:
    svc = make(backend)
    await svc.put([traj("g1-0", "g1")])
    with pytest.raises(SpecError) as err:
        await svc.put([traj("h-0", "h"), traj("g1-1", "g1", task="code")])
    assert err.value.field == "trajectories[1].task"
    with pytest.raises(SpecError) as full:
        await svc.put([traj("g1-1", "g1"), traj("g1-2", "g1")])
    assert full.value.field == "trajectories[1].group_id"
    assert (await svc.stats()).stored == 1


async def test_oversized_trajectory_is_rejected(backend: store.Store) -> None:
    svc = make(backend, max_trajectory_bytes=1024)
    big = traj("big", "g")
    big.turns[0].observation = "x" * 2048
    with pytest.raises(SpecError) as err:
        await svc.put([big])
    assert err.value.field == "trajectories[0]"
    assert (await svc.stats()).stored == 0


async def test_per_task_weights(backend: store.Store) -> None:
    svc = make(backend, task_weights={"math": 1, "code": 1})
    await svc.put([*group("m1"), *group("m2")])
    with pytest.raises(TimeoutError):  # code's quota of 2 is not met yet
        await svc.get_batch(batch_size=4, version=0, timeout_s=0)
    await svc.put(group("c1", task="code"))
    batch = await svc.get_batch(batch_size=4, version=0, timeout_s=0)
    assert list(batch.group_ids) == ["m1", "c1"]


async def test_micro_batches_stream_as_they_fill(backend: store.Store) -> None:
    svc = make(backend)
    await svc.put([*group("g1"), *group("g2"), *group("g3")])
    micro = [m async for m in svc.stream_batch(batch_size=6, micro_batch_size=2, version=0, timeout_s=0)]
    assert [list(m.group_ids) for m in micro] == [["g1"], ["g2"], ["g3"]]
    assert [m.last for m in micro] == [False, False, True]
    for m in micro:
        assert await svc.ack(m.batch_id) == 2


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 2, "timeout_s": -1}, "timeout_s"),
        ({"batch_size": 2, "lease_s": -1}, "lease_s"),
    ],
    ids=["batch-size", "timeout", "lease"],
)
async def test_bad_get_batch(backend: store.Store, kwargs: dict[str, float], field: str) -> None:
    svc = make(backend)
    args = {"version": 0, "timeout_s": 0.0, **kwargs}
    with pytest.raises(SpecError) as err:
        await svc.get_batch(**args)  # type: ignore[arg-type]
    assert err.value.field == field


async def test_each_agent_reads_its_own_experience_table(backend: store.Store) -> None:
    svc = make(backend)
    await svc.put(
        [*group("p1", agent="planner"), *group("e1", agent="executor"), *group("p2", agent="planner")]
    )
    planner = await svc.get_batch(batch_size=4, version=0, timeout_s=0, agent="planner")
    assert list(planner.group_ids) == ["p1", "p2"]
    assert {t.agent for t in planner.trajectories} == {"planner"}
    with pytest.raises(TimeoutError):  # the executor's table holds one group of 2
        await svc.get_batch(batch_size=4, version=0, timeout_s=0, agent="executor")
    anyone = await svc.get_batch(batch_size=2, version=0, timeout_s=0)  # no agent: every table
    assert list(anyone.group_ids) == ["e1"]
    for batch in (planner, anyone):
        await svc.ack(batch.batch_id)
    assert (await svc.stats()).stored == 0


async def test_a_group_belongs_to_one_agent(backend: store.Store) -> None:
    svc = make(backend)
    await svc.put([traj("g-0", "g", agent="planner")])
    with pytest.raises(SpecError) as err:
        await svc.put([traj("g-1", "g", agent="executor")])
    assert err.value.field == "trajectories[0].agent" and "stored for agent 'planner'" in str(err.value)
    assert (await svc.stats()).stored == 1


async def test_expired_lease_returns_to_its_agents_table(backend: store.Store) -> None:
    clock = Clock()
    svc = make(backend, clock)
    await svc.put(group("p1", agent="planner"))
    first = await svc.get_batch(batch_size=2, version=0, timeout_s=0, agent="planner", lease_s=10)
    clock.now += 11
    again = await svc.get_batch(batch_size=2, version=0, timeout_s=0, agent="planner")
    assert list(again.group_ids) == ["p1"] and again.batch_id != first.batch_id


async def test_micro_batch_pipeline_releases_per_agent_and_updates_all_together(backend: store.Store) -> None:
    # FlexMARL: each agent trains 4 samples per step in micro-batches of 2; groups of 2.
    svc = make(backend, agents=["executor", "planner"])
    await svc.put(
        [*group("p1", agent="planner"), *group("p2", agent="planner"), *group("e1", agent="executor")]
    )
    planner = [
        m
        async for m in svc.stream_batch(
            batch_size=4, micro_batch_size=2, version=0, timeout_s=0, agent="planner"
        )
    ]
    assert [list(m.group_ids) for m in planner] == [["p1"], ["p2"]]
    assert [(m.loss_scale, m.last, m.agent) for m in planner] == [
        (0.5, False, "planner"),
        (0.5, True, "planner"),
    ]
    # The executor's rollout ends short: its micro-batch is released, then the stream ends on the timeout.
    executor = [
        m
        async for m in svc.stream_batch(
            batch_size=4, micro_batch_size=2, version=0, timeout_s=0, agent="executor"
        )
    ]
    assert [list(m.group_ids) for m in executor] == [["e1"]]
    with pytest.raises(TimeoutError, match="agents short"):  # nothing is trained yet: no update
        await svc.await_update(agent="planner", timeout_s=0)
    for m in planner:
        await svc.ack(m.batch_id)
    with pytest.raises(TimeoutError):  # the executor's micro-batch is not trained yet
        await svc.await_update(agent="planner", timeout_s=0)
    await svc.ack(executor[0].batch_id)
    updates = [await svc.await_update(agent=a, timeout_s=0) for a in ("planner", "executor")]
    assert updates[0] == updates[1]
    assert updates[0].step == 0
    assert {r.agent: r.factor for r in updates[0].rescale} == {"executor": 2.0, "planner": 1.0}
    # The next step starts from zero for every agent.
    await svc.put(group("p3", agent="planner"))
    nxt = [
        m
        async for m in svc.stream_batch(
            batch_size=2, micro_batch_size=2, version=0, timeout_s=0, agent="planner"
        )
    ]
    assert [list(m.group_ids) for m in nxt] == [["p3"]] and svc.pipeline.step == 1


async def test_the_barrier_waits_for_an_agent_that_has_not_streamed(backend: store.Store) -> None:
    svc = make(backend, agents=["executor", "planner"])
    await svc.put(group("p1", agent="planner"))
    micro = [
        m
        async for m in svc.stream_batch(
            batch_size=2, micro_batch_size=2, version=0, timeout_s=0, agent="planner"
        )
    ]
    await svc.ack(micro[0].batch_id)
    with pytest.raises(TimeoutError):
        await svc.await_update(agent="planner", timeout_s=0.05)


async def test_a_stream_with_nothing_ready_times_out(backend: store.Store) -> None:
    svc = make(backend)
    with pytest.raises(TimeoutError, match="no micro-batch of agent 'planner'"):
        async for _ in svc.stream_batch(
            batch_size=2, micro_batch_size=1, version=0, timeout_s=0.05, agent="planner"
        ):
            pass


async def test_a_stream_whose_step_closes_under_it_ends_and_leaves_the_rest_stored(
    backend: store.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trainer's second stream (a reconnect while the first is still open) takes the rest of the
    step, and its acks close the step while the first stream awaits the store: the first stream then
    ends without an error and releases nothing of the next step."""
    svc = make(backend)
    await svc.put([*group("g1"), *group("g2"), *group("g3")])
    ready = svc._ready
    second: list[buffer_pb2.Batch] = []
    reconnected = False

    async def ready_then_close(agent: str, *, version: int) -> int:
        nonlocal reconnected
        if first and not reconnected:  # once, after the first stream's first micro-batch
            reconnected = True
            second.extend(
                [m async for m in svc.stream_batch(batch_size=4, micro_batch_size=2, version=0, timeout_s=0)]
            )
            for m in [*first, *second]:
                await svc.ack(m.batch_id)
        return await ready(agent, version=version)

    monkeypatch.setattr(svc, "_ready", ready_then_close)
    first: list[buffer_pb2.Batch] = []
    async for m in svc.stream_batch(batch_size=4, micro_batch_size=2, version=0, timeout_s=0):
        first.append(m)
    assert [list(m.group_ids) for m in first] == [["g1"]]
    assert [list(m.group_ids) for m in second] == [["g2"]]
    assert svc.pipeline.step == 1  # the step closed with g1 and g2
    stats = await svc.stats()
    assert (stats.stored, stats.acked) == (2, 4)  # g3 waits for the next step


async def test_an_unreachable_redis_is_unavailable_and_says_so() -> None:
    """Callers retry ``Unavailable``; the message says it is Redis and that nothing was stored."""
    svc = make(redis_store.RedisStore.from_url(f"redis://127.0.0.1:{procs.free_port()}/0", namespace="gone"))
    try:
        with pytest.raises(errors.Unavailable, match=r"Redis unreachable .*nothing was stored or changed"):
            await svc.put(group("g1"))
        with pytest.raises(errors.Unavailable, match="Redis unreachable"):
            await svc.get_batch(batch_size=2, version=0, timeout_s=0)
    finally:
        await svc.store.aclose()


async def test_a_full_redis_refuses_puts_but_still_drains(redis_server: redis_server_mod.RedisServer) -> None:
    """With noeviction (the chart's policy) a full Redis refuses the put whole (``Overloaded``, nothing
    stored), while batches still form and acks still land: they are what frees memory."""
    admin = aioredis.Redis.from_url(redis_server.url)
    s = redis_store.RedisStore.from_url(redis_server.url, namespace=uuid.uuid4().hex)
    svc = make(s)
    await svc.put(group("g1"))
    await admin.config_set("maxmemory-policy", "noeviction")
    await admin.config_set("maxmemory", "1")  # bytes: already full
    try:
        with pytest.raises(errors.Overloaded, match="Redis is full and refuses writes"):
            await svc.put(group("g2"))
        batch = await svc.get_batch(batch_size=2, version=0, timeout_s=0)
        assert list(batch.group_ids) == ["g1"]
        assert await svc.ack(batch.batch_id) == 2
        stats = await svc.stats()
        assert (stats.stored, stats.put, stats.acked) == (0, 2, 2)
    finally:
        await admin.config_set("maxmemory", "0")
        await admin.aclose()
    await svc.put(group("g2"))  # room again: the same put goes through whole
    assert (await svc.stats()).stored == 2
    await s.aclose()
