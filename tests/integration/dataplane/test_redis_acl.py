"""Each job's own Redis user on a real ``redis-server --requirepass``: created by the operator's
``redisacl`` with the password of the job's rendered Secret, used by the job's pods through
``podenv.redis_url``. Its stores (buffer, feeder positions, DARTS statistics, API quotas) work; no
password, another job's password, another job's keys and the admin commands are all refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
import yaml

from treadle import auth, errors
from treadle.api import env_vars, v1alpha1
from treadle.operator import config, redisacl
from treadle.operator.render import common as render_common
from treadle.operator.render import security
from treadle.policy import feeding
from treadle.policy.tangram import quota
from treadle.sandbox import cores
from treadle.services import podenv
from treadle.services.buffer import redis_store, service
from treadle.services.env import quotas
from treadle.services.feeder import store as feeder_store
from treadle.services.httputil import app as http_app
from treadle.services.scheduler import darts_store, journal
from treadle.services.scheduler import protocol as scheduler_protocol
from treadle.testing import redis_server as redis_server_mod
from treadle.v1 import common_pb2

EXAMPLE = Path(__file__).parents[3] / "manifests" / "examples" / "math-tool-h20.yaml"
ADMIN = "the chart's admin password"


@pytest.fixture
def guarded() -> Iterator[redis_server_mod.RedisServer]:
    with redis_server_mod.redis_server(password=ADMIN) as server:
        yield server


def job(name: str) -> v1alpha1.RolloutJob:
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["metadata"] |= {"name": name, "namespace": "team-a", "uid": f"uid-{name}"}
    return v1alpha1.parse_job(raw)


def password(j: v1alpha1.RolloutJob, cfg: config.OperatorConfig) -> str:
    return str(security.render_secret(j, cfg)["stringData"][auth.REDIS_PASSWORD_KEY])


def pod_url(j: v1alpha1.RolloutJob, cfg: config.OperatorConfig, secret: str, tmp_path: Path) -> str:
    """The URL a pod of ``j`` connects with: the rendered variables, the Secret's file where it is mounted."""
    path = tmp_path / f"{j.name}-redis-password"
    path.write_text(secret)
    environ = {env_vars.REDIS_URL: cfg.redis_url, env_vars.KEY_PREFIX: render_common.prefix_of(j),
               env_vars.REDIS_PASSWORD_FILE: str(path)}  # fmt: skip
    return podenv.redis_url(environ)


def trajectory(tid: str) -> common_pb2.Trajectory:
    t = common_pb2.Trajectory(trajectory_id=tid, group_id="g", task="math", group_size=2, status="completed",
                              reward=1.0)  # fmt: skip
    t.turns.add(output_token_ids=[1], output_logprobs=[-0.1], output_versions=[0])
    return t


async def test_each_job_reaches_only_its_own_keys(
    guarded: redis_server_mod.RedisServer, tmp_path: Path
) -> None:
    cfg = config.OperatorConfig(redis_url=guarded.url, redis_password=ADMIN, auth_key="the operator's key")
    a, b = job("a"), job("b")
    for j in (a, b):
        redisacl.ensure_user(cfg, j, password(j, cfg))
    redisacl.ensure_user(cfg, a, password(a, cfg))  # every reconcile: idempotent
    pa, pb = render_common.prefix_of(a), render_common.prefix_of(b)
    assert (pa, pb) == ("team-a/a/uid-a", "team-a/b/uid-b")
    url_a = pod_url(a, cfg, password(a, cfg), tmp_path)
    assert url_a.startswith("redis://team-a%2Fa%2Fuid-a:")

    # The job's own stores, each through its real code (Lua scripts included).
    client = aioredis.Redis.from_url(url_a, protocol=2)
    try:
        svc = service.BufferService(store=redis_store.RedisStore(client, namespace=pa), alpha=1)
        assert (await svc.put([trajectory("t0"), trajectory("t1")])).stored == 2
        batch = await svc.get_batch(batch_size=2, version=0, timeout_s=0)
        assert await svc.ack(batch.batch_id) == 2
        positions = feeder_store.PositionStore(client, feeder_store.key(pa, "math", "d"))
        await positions.record(feeding.Position(0, 0), 2, feeding.Position(0, 2))
        assert (await positions.load()) is not None
        stats = darts_store.RedisStats(client, namespace=pa)
        assert await stats.load("math") is None
        work = journal.RedisJournal(client, namespace=pa)
        await work.accept([journal.Group(scheduler_protocol.PromptGroup("g", "math"), seq=0, pool=2)])
        assert [g.group.group_id for g in (await work.load()).groups] == ["g"]
        limits = {"search": quota.limit(0, "search", requests_per_minute=10, max_concurrent=1)}
        registry = http_app.registry()
        q = quotas.Quotas(client=client, namespace=pa, limits=limits, registry=registry,
                          action_metrics=cores.ActionMetrics(registry))  # fmt: skip
        async with q.hold(["search"]) as held:
            assert held == {"search": 1}

        # Another job's keys: refused, by every store.
        other = service.BufferService(store=redis_store.RedisStore(client, namespace=pb), alpha=1)
        with pytest.raises(
            redis.exceptions.ResponseError, match=r"can't access|no permissions to access"
        ):  # in its Lua script
            await other.put([trajectory("forged")])
        with pytest.raises(redis.exceptions.NoPermissionError):
            await darts_store.RedisStats(client, namespace=pb).load("math")
        with pytest.raises(errors.Unavailable, match=r"NOPERM|permission"):
            await journal.RedisJournal(client, namespace=pb).load()
        with pytest.raises(redis.exceptions.NoPermissionError):
            await client.get(f"{pb}:tangram:quota:{{search}}:q")
        # Listing or wiping the shared Redis, or changing the users: refused.
        for command in (("KEYS", "*"), ("FLUSHALL",), ("ACL", "LIST"), ("CONFIG", "GET", "requirepass")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                await client.execute_command(*command)
    finally:
        await client.aclose()

    # No password, another job's password, a made-up one: no login.
    for url in (guarded.url, pod_url(a, cfg, password(b, cfg), tmp_path), pod_url(a, cfg, "guess", tmp_path)):
        anon = aioredis.Redis.from_url(url, protocol=2)
        try:
            with pytest.raises(redis.exceptions.AuthenticationError):
                await anon.get(f"treadle:buf:{{{pa}}}:x")
        finally:
            await anon.aclose()

    # Job a is deleted and at once created again under its name (another uid) before the operator's
    # delete handler ran (it has no finalizer): the new one has its own user and keys from the start.
    again = job("a")
    again.metadata["uid"] = "uid-a2"
    redisacl.ensure_user(cfg, again, password(again, cfg))
    again_client = aioredis.Redis.from_url(pod_url(again, cfg, password(again, cfg), tmp_path), protocol=2)
    try:
        fresh = journal.RedisJournal(again_client, namespace=render_common.prefix_of(again))
        assert (await fresh.load()).groups == []  # the deleted job's accepted groups are not taken up
        await fresh.accept([journal.Group(scheduler_protocol.PromptGroup("g-new", "math"), seq=0, pool=2)])
    finally:
        await again_client.aclose()

    keys_b = set(redis.Redis.from_url(guarded.url, password=ADMIN).keys(f"*{{{pb}}}*"))
    keys_again = set(redis.Redis.from_url(guarded.url, password=ADMIN).keys("*uid-a2*"))
    assert keys_again
    assert redisacl.delete_keys(cfg, a.namespace, a.name, "uid-a") >= 5  # buffer, feeder, journal, quota...
    with redis.Redis.from_url(guarded.url, password=ADMIN) as admin:
        assert not admin.keys("*" + pa + "[}:]*"), "a deleted job's keys are left"
        assert set(admin.keys(f"*{{{pb}}}*")) == keys_b  # another job's keys are not touched
        assert set(admin.keys("*uid-a2*")) == keys_again  # nor those of the job re-created
    redisacl.delete_user(cfg, a.namespace, a.name, "uid-a")  # the job is deleted: its user goes with it
    with redis.Redis.from_url(pod_url(again, cfg, password(again, cfg), tmp_path), protocol=2) as pod:
        assert pod.ping()  # the re-created job's user stays
    gone = aioredis.Redis.from_url(url_a, protocol=2)
    try:
        with pytest.raises(redis.exceptions.AuthenticationError):
            await gone.ping()
    finally:
        await gone.aclose()


def test_the_jobs_users_come_back_when_redis_restarts(tmp_path: Path) -> None:
    """ACL users live in Redis's memory only: the operator's keeper sees the new run_id and sets up every
    known job's user again, so the job's pods log in as before."""
    cfg = config.OperatorConfig(auth_key="the operator's key", redis_password=ADMIN)
    a, b = job("a"), job("b")
    known = [(j.namespace, j.name, str(j.metadata["uid"])) for j in (a, b)]
    with redis_server_mod.redis_server(password=ADMIN) as first:
        cfg = dataclasses.replace(cfg, redis_url=first.url)
        for j in (a, b):
            redisacl.ensure_user(cfg, j, password(j, cfg))
        keeper = redisacl.UserKeeper(cfg, lambda: known)
        assert keeper.check() == 0  # its first look: the run it started beside
        assert keeper.check() == 0  # the same run: nothing to do
        port = first.port
    url = pod_url(a, cfg, password(a, cfg), tmp_path)
    with redis_server_mod.redis_server(password=ADMIN, port=port):
        # Restarted: the user is gone.
        with (
            redis.Redis.from_url(url, protocol=2) as pod,
            pytest.raises(redis.exceptions.AuthenticationError),
        ):
            pod.ping()
        # A round that fails midway (here: after the first user) is done again whole, not taken as done.
        keeper.jobs = lambda: failing_after_one(known)
        with pytest.raises(redis.exceptions.ConnectionError):
            keeper.check()
        keeper.jobs = lambda: known
        assert keeper.check() == 2
        with redis.Redis.from_url(url, protocol=2) as pod:
            assert pod.ping()
            pod.set(f"treadle:buf:{{{render_common.prefix_of(a)}}}:x", "1")
            with pytest.raises(redis.exceptions.NoPermissionError):  # and is as restricted as before
                pod.get(f"treadle:buf:{{{render_common.prefix_of(b)}}}:x")
        assert keeper.check() == 0


def failing_after_one(jobs: list[tuple[str, str, str]]) -> Iterator[tuple[str, str, str]]:
    """``jobs``' first, then Redis gone (what the keeper sees when Redis dies again mid-round)."""
    yield jobs[0]
    raise redis.exceptions.ConnectionError("Redis went away mid-round")
