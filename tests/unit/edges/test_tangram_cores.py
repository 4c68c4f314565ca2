"""The pod's CPU action manager (``treadle.sandbox.cores``) on a fake clock: probing, the fitted
elasticity, disjoint grants, FCFS waits, cancellation, and that its grants are the policy's."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from treadle.api import jobconfig, v1alpha1
from treadle.policy.tangram import model, pools, schedule
from treadle.sandbox import cores
from treadle.services.reward import http_app as reward_app


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def manager(n: int, upper: int, clock: Clock | None = None) -> cores.CoreManager:
    return cores.CoreManager(upper=upper, cpus=range(n), domains=[list(range(n))], clock=clock or Clock())


def learn(m: cores.CoreManager, kind: str, samples: list[tuple[int, float]]) -> None:
    """Feed measured runs, as finished actions would (each at the amount the manager granted)."""
    for units, seconds in samples:
        m.profile(kind).observe(units, seconds)


async def test_a_new_kind_probes_upper_then_one_core_then_fits() -> None:
    m = manager(8, 4)
    first = await m.acquire("t")
    assert first.units == 4  # what cpuCoresPerAction gave every run before the manager
    m.release(first, duration_s=1.0)
    second = await m.acquire("t")
    assert second.units == 1
    m.release(second, duration_s=4.0)
    assert m.profile("t").elasticity is not None
    assert m.profile("t").elasticity.efficiency == pytest.approx((1.0, 1.0, 1.0, 1.0))
    alone = await m.acquire("t")
    assert alone.units == 4  # linear speed-up, cores free: the most it may have


async def test_upper_one_never_probes() -> None:
    m = manager(4, 1)
    for _ in range(3):
        g = await m.acquire("t")
        assert g.units == 1
        m.release(g, duration_s=1.0)
    assert m.profile("t").elasticity is None


async def test_code_that_does_not_speed_up_keeps_one_core() -> None:
    m = manager(8, 4)
    learn(m, "t", [(4, 2.0), (1, 2.0)])
    e = m.profile("t").elasticity
    assert e is not None and e.efficiency == pytest.approx((1.0, 1 / 2, 1 / 3, 1 / 4))
    assert (await m.acquire("t")).units == 1


async def test_concurrent_elastic_actions_get_disjoint_cores() -> None:
    m = manager(8, 4)
    learn(m, "t", [(4, 1.0), (1, 4.0)])
    grants = [await m.acquire("t") for _ in range(2)]
    assert [g.units for g in grants] == [4, 4]  # each arrives to free cores: the most it may have
    assert set(grants[0].cores).isdisjoint(grants[1].cores) and m.free == 0
    third = asyncio.ensure_future(m.acquire("t"))
    await asyncio.sleep(0)
    assert not third.done()  # no core is shared: it waits
    m.release(grants[0], duration_s=1.0)
    assert set((await third).cores) == set(grants[0].cores)


async def test_the_grants_are_the_policy_decision() -> None:
    m = manager(6, 6)
    busy = await m.acquire("other")  # its probe holds all six cores while three queue
    learn(m, "t", [(6, 1.0), (1, 5.0)])  # Amdahl with a serial part
    waiting = [m.profile("t").action(f"a{i}") for i in range(3)]
    want = schedule.decide(waiting, [], {cores.CPU: pools.FlatPool(6, 6)}, cores.SETTINGS)
    queued = [asyncio.ensure_future(m.acquire("t")) for _ in range(3)]
    await asyncio.sleep(0)
    m.release(busy, duration_s=1.0)
    for _ in range(3):  # the shielded grant reaches each waiting task
        await asyncio.sleep(0)
    got = [q.result().units for q in queued if q.done()]
    assert got == [g.units[cores.CPU] for g in want] and sum(got) <= 6
    for q in queued:
        q.cancel()


async def test_fcfs_wait_for_a_released_core() -> None:
    clock = Clock()
    m = manager(2, 1, clock)
    a, b = await m.acquire("t"), await m.acquire("t")
    third = asyncio.ensure_future(m.acquire("t"))
    await asyncio.sleep(0)
    assert not third.done() and m.queued == 1
    clock.now = 2.5
    m.release(b, duration_s=2.5)
    granted = await third
    assert granted.cores == b.cores and granted.queued_s == 2.5 and m.queued == 0
    m.release(a, duration_s=2.5)
    m.release(granted, duration_s=0.1)
    assert m.free == 2


async def test_a_cancelled_wait_leaves_the_queue_and_keeps_no_core() -> None:
    m = manager(1, 1)
    held = await m.acquire("t")
    waiter = asyncio.ensure_future(m.acquire("t"))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert m.queued == 0
    m.release(held, duration_s=1.0)
    assert m.free == 1


async def test_a_waiting_head_is_not_passed() -> None:
    m = manager(4, 4)
    learn(m, "one", [(4, 1.0), (1, 1.0)])  # does not speed up: one core each
    busy = [await m.acquire("one"), await m.acquire("one")]
    big = asyncio.ensure_future(m.acquire("big"))  # a new kind probes at 4 cores: does not fit
    small = asyncio.ensure_future(m.acquire("one"))  # would fit on the 2 free cores, but is behind
    await asyncio.sleep(0)
    assert not big.done() and not small.done() and m.free == 2
    for g in busy:
        m.release(g, duration_s=1.0)
    assert (await big).units == 4
    await asyncio.sleep(0)
    assert not small.done()
    m.release(big.result(), duration_s=1.0)
    assert (await small).units == 1


def test_numa_domains_from_sysfs(tmp_path: Path) -> None:
    for node, cpulist in (("node0", "0-3,8\n"), ("node1", "4-7,9-10\n")):
        (tmp_path / node).mkdir()
        (tmp_path / node / "cpulist").write_text(cpulist)
    assert cores.numa_domains([0, 2, 5, 9, 12], tmp_path) == [[0, 2], [5, 9], [12]]
    assert cores.numa_domains([1, 2], tmp_path / "none") == [[1, 2]]


def test_profile_action_is_the_policy_model() -> None:
    p = cores.CoreManager(upper=4, cpus=range(4), domains=[range(4)]).profile("x")
    probe = p.action("x")
    assert probe.cost == {cores.CPU: (4,)} and probe.elasticity is None and not probe.scalable
    p.observe(4, 1.0)
    p.observe(1, 3.0)
    fitted = p.action("y")
    assert isinstance(fitted, model.Action) and fitted.options == (1, 2, 3, 4)
    assert fitted.duration_s == 3.0 and fitted.duration(4) == pytest.approx(1.0)


def test_the_reward_gateway_grants_code_tests_cores_as_the_env_pods() -> None:
    spec = {
        "agents": [{"name": "a", "model": "m"}],
        "pools": [{"name": "p", "agent": "a", "accelerator": "H100"}],
        "tasks": [{"name": "t", "agents": ["a"], "environment": "python-code", "reward": "code-tests"}],
        "externalResources": {"cpuCoresPerAction": "1500m"},
    }
    job = v1alpha1.RolloutJob(metadata={"name": "j"}, spec=v1alpha1.parse_spec(spec))
    config = jobconfig.job_config(job, max_tokens=8, max_in_flight=8, max_concurrent_generations=8)
    assert config.reward.cpu_per_action == config.env.cpu_per_action == "1500m"
    upper = cores.cpus_per_action(config.reward.cpu_per_action)
    box = reward_app.build_app(cpus_per_action=upper).state.svc.resources.sandbox
    assert isinstance(box.cores, cores.CoreManager) and box.cores.upper == min(
        2, len(os.sched_getaffinity(0))
    )
    assert reward_app.build_app().state.svc.resources.sandbox.cores is None  # no job: unpinned, as before
