"""Env steps are applied once per index: retries join or replay, out-of-order steps are refused."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import prometheus_client
import pytest

from treadle import errors
from treadle.services.env import base, protocol, service


class Counter:
    """Counts the actions it applied; a step waits on ``gate`` so a test can hold it in flight."""

    def __init__(self, gate: asyncio.Event) -> None:
        self.gate = gate
        self.applied: list[str] = []

    async def reset(self) -> tuple[str, dict[str, Any]]:
        return "count", {}

    async def step(self, action: str) -> base.Outcome:
        await self.gate.wait()
        self.applied.append(action)
        return base.Outcome(f"applied {len(self.applied)}", done=False, info={"n": len(self.applied)})

    async def close(self) -> None:
        return None


def make() -> tuple[service.EnvService, Counter, asyncio.Event]:
    gate = asyncio.Event()
    env = Counter(gate)

    def factory(seed: int, options: Mapping[str, Any], ctx: base.Context) -> Counter:
        return env

    svc = service.EnvService(
        registry=prometheus_client.CollectorRegistry(), context=base.Context(),
        specs={"counter": base.Spec("counter", "counts steps", factory)},
    )  # fmt: skip
    return svc, env, gate


async def opened() -> tuple[service.EnvService, Counter, asyncio.Event]:
    svc, env, gate = make()
    await svc.open(protocol.OpenRequest(env="counter", session_id="s", seed=0))
    return svc, env, gate


async def test_a_repeated_index_replays_the_result_of_a_lost_reply() -> None:
    svc, env, gate = await opened()
    gate.set()
    first = await svc.step("s", "a", index=0)
    again = await svc.step("s", "a", index=0)  # the reply of the first was lost
    assert again == first and env.applied == ["a"] and svc.replays == 1
    assert (await svc.step("s", "b", index=1)).info == {"n": 2}


async def test_a_retry_of_the_step_in_flight_joins_it_even_when_the_first_caller_left() -> None:
    svc, env, gate = await opened()
    caller = asyncio.create_task(svc.step("s", "a", index=0))
    await asyncio.sleep(0)  # the step starts and waits on the gate
    caller.cancel()  # the client timed out
    retry = asyncio.create_task(svc.step("s", "a", index=0))
    await asyncio.sleep(0)
    gate.set()
    result = await retry
    assert env.applied == ["a"] and result.info == {"n": 1}
    assert caller.cancelled()
    assert svc.sessions["s"].steps == 1 and not svc.sessions["s"].busy


@pytest.mark.parametrize(
    ("index", "action", "message"),
    [
        (2, "c", "step 2 of session 's' is out of order: 1 applied, the next is 1"),  # skipped one
        (0, "other", "step 0 of session 's' was applied with another action"),  # index reused
    ],
    ids=["ahead", "same-index-other-action"],
)
async def test_out_of_order_steps_are_refused_and_change_nothing(
    index: int, action: str, message: str
) -> None:
    svc, env, gate = await opened()
    gate.set()
    await svc.step("s", "a", index=0)
    with pytest.raises(errors.Conflict) as refused:
        await svc.step("s", action, index=index)
    assert str(refused.value) == message
    assert env.applied == ["a"] and svc.sessions["s"].steps == 1


async def test_another_index_while_one_is_in_flight_is_refused() -> None:
    svc, env, gate = await opened()
    first = asyncio.create_task(svc.step("s", "a", index=0))
    await asyncio.sleep(0)
    with pytest.raises(errors.Conflict, match="is applying step 0; step 1 must wait for it"):
        await svc.step("s", "b", index=1)
    gate.set()
    await first
    assert env.applied == ["a"]
