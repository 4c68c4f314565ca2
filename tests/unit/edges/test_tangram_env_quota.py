"""The env service and the job's API quotas: a step's declared tools are held before it runs and
released after, outside its timeout; quotas without Redis refuse to start, naming the variable.
The quota here is a recording stand-in; the real one runs on Redis in
``tests/integration/edges/test_tangram_quota_*.py``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, cast

import prometheus_client
import pytest

from treadle import errors
from treadle.api import env_vars
from treadle.policy.tangram import quota
from treadle.services.env import base, examples, http_app, protocol, quotas, service


class Searcher:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def tools_for(self, action: str) -> list[str]:
        return ["web-search"] if "search" in action else []

    async def reset(self) -> tuple[str, dict[str, Any]]:
        return "go", {}

    async def step(self, action: str) -> base.Outcome:
        self.log.append(f"step {action}")
        return base.Outcome("ok", done=False)

    async def close(self) -> None:
        return None


class RecordingQuotas:
    """Stands in for ``quotas.Quotas``: records holds; ``gate`` keeps a hold waiting in line."""

    def __init__(self, log: list[str], gate: asyncio.Event) -> None:
        self.log, self.gate = log, gate

    @contextlib.asynccontextmanager
    async def hold(self, tools: Sequence[str]) -> AsyncIterator[dict[str, int]]:
        self.log.append(f"wait {list(tools)}")
        await self.gate.wait()
        self.log.append("granted")
        yield {t: 1 for t in tools}
        self.log.append("released")


def make(log: list[str], gate: asyncio.Event) -> service.EnvService:
    def factory(seed: int, options: Mapping[str, Any], ctx: base.Context) -> Searcher:
        return Searcher(log)

    return service.EnvService(
        registry=prometheus_client.CollectorRegistry(), context=base.Context(),
        specs={"searcher": base.Spec("searcher", "searches", factory)}, step_timeout_s=0.05,
        quotas=cast(quotas.Quotas, RecordingQuotas(log, gate)),
    )  # fmt: skip


async def test_declared_tools_are_held_around_the_step_outside_its_timeout() -> None:
    log: list[str] = []
    gate = asyncio.Event()
    svc = make(log, gate)
    await svc.open(protocol.OpenRequest(env="searcher", session_id="s", seed=0))
    step = asyncio.ensure_future(svc.step("s", "search it", index=0))
    for _ in range(20):  # longer in line than the 0.05 s step timeout would allow, on a fake wait
        await asyncio.sleep(0)
    assert log == ["wait ['web-search']"] and not step.done()
    gate.set()
    assert (await step).observation == "ok"
    assert log == ["wait ['web-search']", "granted", "step search it", "released"]
    assert (await svc.step("s", "think", index=1)).observation == "ok"  # no tool: no hold
    assert log[-1] == "step think"


def test_quotas_without_redis_refuse_to_start_naming_the_variable() -> None:
    limits = quota.limits([("web-search", 600, 32)])
    with pytest.raises(errors.SpecError) as info:
        http_app.build_app(api_quotas=limits)
    assert info.value.field == env_vars.REDIS_URL and "web-search" in str(info.value)


def test_the_example_search_env_declares_its_tool() -> None:
    env = examples.WebSearch(0, {"search_url": "http://127.0.0.1:1"}, base.Context())
    assert isinstance(env, base.UsesTools)
    assert env.tools_for("<search>q</search>") == ["web-search"] and env.tools_for("<answer>a</answer>") == []
    with pytest.raises(errors.SpecError) as info:
        examples.WebSearch(0, {"search_url": "ftp://x"}, base.Context())
    assert info.value.field == "options.search_url"
