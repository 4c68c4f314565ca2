"""Env session table and reward idempotency, driven directly (no sockets, fake clock)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import prometheus_client
import pytest

from treadle import errors
from treadle.services.env import base, mathtool, protocol, service
from treadle.services.reward import functions
from treadle.services.reward import protocol as reward_protocol
from treadle.services.reward import service as reward_service


class Broken:
    """An environment whose step raises: it must take down only its own session."""

    async def reset(self) -> tuple[str, dict[str, Any]]:
        return "ready", {}

    async def step(self, action: str) -> base.Outcome:
        raise RuntimeError("simulator crashed")

    async def close(self) -> None:
        return None


def _broken(seed: int, options: Mapping[str, Any], ctx: base.Context) -> Broken:
    return Broken()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_service(clock: Clock | None = None, **kw: Any) -> service.EnvService:
    specs = {**service.BUILTIN, "broken": base.Spec("broken", "raises on step", _broken)}
    return service.EnvService(
        registry=prometheus_client.CollectorRegistry(), context=base.Context(), specs=specs,
        clock=clock or Clock(), **kw,
    )  # fmt: skip


def open_req(sid: str, env: str = "math-tool", seed: int = 1, **kw: Any) -> protocol.OpenRequest:
    return protocol.OpenRequest(env=env, session_id=sid, seed=seed, **kw)


async def test_open_is_idempotent_until_the_first_step() -> None:
    svc = make_service()
    first = await svc.open(open_req("a"))
    assert await svc.open(open_req("a")) == first
    with pytest.raises(errors.Conflict):
        await svc.open(open_req("a", seed=2))  # same id, other task
    await svc.step("a", "<calculator>1+1</calculator>", index=0)
    with pytest.raises(errors.Conflict):
        await svc.open(open_req("a"))  # a retry after steps would rewind the episode
    assert svc.stats().active == 1 and svc.stats().opened == 1


async def test_bad_open_stores_nothing() -> None:
    svc = make_service()
    with pytest.raises(errors.SpecError) as unknown:
        await svc.open(open_req("a", env="chess"))
    with pytest.raises(errors.SpecError) as bad_option:
        await svc.open(open_req("a", options={"max_turns": -1}))
    assert (unknown.value.field, bad_option.value.field) == ("env", "options.max_turns")
    assert svc.stats().active == 0 and svc.stats().opened == 0


async def test_failing_env_loses_only_its_session_and_says_why() -> None:
    svc = make_service()
    await svc.open(open_req("good"))
    await svc.open(open_req("bad", env="broken"))
    with pytest.raises(errors.Unavailable, match="simulator crashed"):
        await svc.step("bad", "x", index=0)
    with pytest.raises(errors.NotFound, match="failed earlier: step raised RuntimeError: simulator crashed"):
        await svc.step("bad", "x", index=0)  # the scheduler's retry learns the reason
    good = await svc.step("good", "<calculator>2*3</calculator>", index=0)
    assert good.observation == "<result>6</result>"
    assert svc.stats().model_dump() == {"active": 1, "opened": 2, "failed": 1, "max_sessions": 10_000}


async def test_capacity_and_close() -> None:
    svc = make_service(max_sessions=2)
    await svc.open(open_req("a"))
    await svc.open(open_req("b"))
    with pytest.raises(errors.Unavailable, match="at capacity"):
        await svc.open(open_req("c"))
    await svc.close("a")
    with pytest.raises(errors.NotFound):
        await svc.close("a")
    await svc.open(open_req("c"))
    assert sorted(svc.sessions) == ["b", "c"]


async def test_idle_sessions_are_reaped() -> None:
    clock = Clock()
    svc = make_service(clock, idle_ttl_s=60)
    await svc.open(open_req("old"))
    clock.now = 50
    await svc.open(open_req("new"))
    clock.now = 100
    assert await svc.reap() == ["old"]
    assert list(svc.sessions) == ["new"]


def make_reward(fn: functions.Fn | None = None) -> reward_service.RewardService:
    svc = reward_service.RewardService(
        registry=prometheus_client.CollectorRegistry(), resources=functions.Resources()
    )
    return svc


def score_req(tid: str = "t1", **kw: Any) -> reward_protocol.ScoreRequest:
    return reward_protocol.ScoreRequest(
        trajectory_id=tid, **{"reward_fn": "math", "response": "<answer>4</answer>", "reference": "4", **kw}
    )


async def test_reward_is_idempotent_per_trajectory() -> None:
    svc = make_reward()
    first = await svc.score(score_req())
    again = await svc.score(score_req())
    assert (first.reward, first.cached, again.reward, again.cached) == (1.0, False, 1.0, True)
    with pytest.raises(errors.Conflict):
        await svc.score(score_req(response="<answer>5</answer>"))


async def test_concurrent_duplicates_join_one_computation(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0
    gate = asyncio.Event()

    async def slow(req: reward_protocol.ScoreRequest, res: functions.Resources) -> functions.Scored:
        nonlocal calls
        calls += 1
        await gate.wait()
        return 0.5, {}

    monkeypatch.setitem(functions.BUILTIN, "slow", (slow, "test"))
    svc = make_reward()
    tasks = [asyncio.create_task(svc.score(score_req(reward_fn="slow"))) for _ in range(5)]
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(*tasks)
    assert calls == 1 and [r.reward for r in results] == [0.5] * 5
    assert sorted(r.cached for r in results) == [False, True, True, True, True]


async def test_failures_are_not_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    outcomes: list[Exception | float] = [RuntimeError("flaky"), 1.0]

    async def flaky(req: reward_protocol.ScoreRequest, res: functions.Resources) -> functions.Scored:
        out = outcomes.pop(0)
        if isinstance(out, Exception):
            raise out
        return out, {}

    monkeypatch.setitem(functions.BUILTIN, "flaky", (flaky, "test"))
    svc = make_reward()
    with pytest.raises(errors.Unavailable, match="flaky"):
        await svc.score(score_req(reward_fn="flaky"))
    assert (await svc.score(score_req(reward_fn="flaky"))).reward == 1.0


def test_math_tool_spec_is_registered() -> None:
    assert service.BUILTIN["math-tool"] is mathtool.SPEC
