"""Placement's weight sync (``SwapWeights``): the fan-out over fake swappers, targets and the staleness rule.

The swapper is a recording fake (no agents, no engines); retries sleep through an injected no-op
or a hand-moved clock. The real waits are the timeout case's deadline (10 ms) and the lost worker's
watch (5 ms polls). Real agents and engines: tests/integration.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from treadle import errors, metrics
from treadle.api import jobconfig
from treadle.client import swapper as swapper_mod
from treadle.services.agent import client as agent_client
from treadle.services.placement import protocol, service, weightsync
from treadle.v1 import placement_pb2 as pb

HANG = "hang"
Step = Exception | str | None
"""What one swap try of a worker does: raise, ``HANG`` (never returns), or ``None`` (swaps)."""


class FakeSwapper:
    def __init__(self, steps: dict[str, list[Step]] | None = None) -> None:
        self.steps = steps or {}
        self.calls: list[tuple[str, str, int, str]] = []
        self.prefetched: list[tuple[str, int]] = []
        self.fail_prefetch: set[str] = set()
        self.called = asyncio.Event()

    async def swap(
        self, worker: pb.Worker, *, agent: str, version: int, expect_agent: str = ""
    ) -> agent_client.Swapped:
        self.calls.append((worker.worker_id, agent, version, expect_agent))
        self.called.set()
        plan = self.steps.get(worker.worker_id, [])
        step = plan.pop(0) if plan else None
        if step == HANG:
            await asyncio.Event().wait()
        if isinstance(step, Exception):
            raise step
        return agent_client.Swapped(exposed_s=0.25, pull="prefetched")

    async def prefetch(self, worker: pb.Worker, *, version: int) -> None:
        if worker.worker_id in self.fail_prefetch:
            raise errors.Unavailable("engine down")
        self.prefetched.append((worker.worker_id, version))


async def no_sleep(_: float) -> None:
    await asyncio.sleep(0)


class Clock:
    """Placement's clock, moved by hand (and by ``sleep``: each retry wait passes that long)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


def make(
    workers: dict[str, str], *, pool_agents: dict[str, str], alpha: int | None = 1,
    lost_after_s: float | None = None, clock: Clock | None = None,
) -> service.PlacementService:  # fmt: skip
    pools = {p: "decode-heavy" for p in pool_agents}
    svc = service.PlacementService(
        pools=pools, tasks={"math": jobconfig.TaskPlacement()}, pool_agents=pool_agents, alpha=alpha,
        lost_after_s=lost_after_s, clock=clock or Clock(),
    )  # fmt: skip
    for wid, pool in workers.items():
        svc.register_worker(pb.Worker(worker_id=wid, pool=pool, address=f"http://{wid}", engine_address="e"))
    return svc


def report(svc: service.PlacementService, wid: str, version: int, healthy: bool = True) -> None:
    svc.report_load(pb.WorkerLoad(worker_id=wid, policy_version=version, healthy=healthy))


def versions(svc: service.PlacementService) -> dict[str, int]:
    return {w.worker.worker_id: w.load.policy_version for w in svc.pool_state().workers}


def assignable(svc: service.PlacementService) -> set[str]:
    return {w.worker.worker_id for w in svc.pool_state().workers if w.load.healthy}


def outcomes(result: protocol.SwapResult) -> dict[str, str]:
    return {w.worker_id: w.outcome for w in result.workers}


ONE = {"pool": "policy"}
TWO = {"plan": "planner", "exec": "executor"}


async def test_a_swap_reaches_every_worker_and_becomes_the_target() -> None:
    svc = make({"w0": "pool", "w1": "pool", "w2": "pool"}, pool_agents=ONE)
    fake = FakeSwapper()
    sync = weightsync.WeightSync(svc, fake, apply_weights=True, sleep=no_sleep)
    result = await sync.swap(protocol.SwapRequest(version=3))
    assert outcomes(result) == {"w0": "swapped", "w1": "swapped", "w2": "swapped"}
    assert result.agent == "policy" and result.swapped == ("w0", "w1", "w2")
    # A job of one agent publishes under the job's prefix: no agent goes to the engine.
    assert sorted(fake.calls) == [("w0", "", 3, ""), ("w1", "", 3, ""), ("w2", "", 3, "")]
    assert versions(svc) == {"w0": 3, "w1": 3, "w2": 3}
    assert {svc.target_for(w) for w in ("w0", "w1", "w2")} == {3}
    assert {w.exposed_seconds for w in result.workers} == {0.25}
    count = svc.registry.get_sample_value(
        f"{metrics.PLACEMENT_WEIGHT_SWAP_SECONDS}_count", {"pool": "pool", "pull": "prefetched"}
    )
    assert count == 3
    assert svc.pool_state().agents[0].target_version == 3


async def test_one_worker_failing_and_one_timing_out_leave_the_rest_swapped() -> None:
    svc = make({"w0": "pool", "w1": "pool", "w2": "pool"}, pool_agents=ONE, alpha=0)
    fake = FakeSwapper({"w1": [agent_client.SwapRefused("v2 lacks 1 tensor")], "w2": [HANG]})
    sync = weightsync.WeightSync(svc, fake, apply_weights=True, sleep=no_sleep)
    # w2 hangs until the deadline; w0 and w1 answer at once (0.5 s: room for a loaded event loop)
    result = await sync.swap(protocol.SwapRequest(version=2, timeout_s=0.5))
    assert outcomes(result) == {"w0": "swapped", "w1": "failed", "w2": "timeout"}
    by_id = {w.worker_id: w for w in result.workers}
    assert "lacks 1 tensor" in by_id["w1"].error and "still swapping" in by_id["w2"].error
    # The refused version is not tried again at once: the engine kept its previous version whole.
    assert [c[0] for c in fake.calls].count("w1") == 1
    assert versions(svc) == {"w0": 2, "w1": 0, "w2": 0}
    # Staleness 0: only the worker serving the target takes turns; the others are told the target.
    assert assignable(svc) == {"w0"}
    assert (svc.target_for("w1"), svc.target_for("w2")) == (2, 2)
    for outcome in ("failed", "timeout"):
        labels = {"pool": "pool", "outcome": outcome}
        assert svc.registry.get_sample_value(metrics.PLACEMENT_WEIGHT_SWAP_FAILURES_TOTAL, labels) == 1
    report(svc, "w1", 2)  # its agent loaded the target by itself
    assert assignable(svc) == {"w0", "w1"}


async def test_an_unreachable_or_busy_worker_is_tried_again_until_it_swaps() -> None:
    svc = make({"w0": "pool"}, pool_agents=ONE)
    steps: list[Step] = [errors.Unavailable("agent restarting"), agent_client.SwapContended("409"), None]
    fake = FakeSwapper({"w0": steps})
    result = await weightsync.WeightSync(svc, fake, apply_weights=True, sleep=no_sleep).swap(
        protocol.SwapRequest(version=1)
    )
    assert outcomes(result) == {"w0": "swapped"} and len(fake.calls) == 3


async def test_each_worker_loads_its_own_agents_version() -> None:
    svc = make({"p0": "plan", "e0": "exec", "e1": "exec"}, pool_agents=TWO)
    report(svc, "p0", 4)
    fake = FakeSwapper()
    sync = weightsync.WeightSync(svc, fake, apply_weights=True, sleep=no_sleep)
    result = await sync.swap(protocol.SwapRequest(version=2, agent="executor"))
    assert outcomes(result) == {"e0": "swapped", "e1": "swapped"} and result.agent == "executor"
    assert sorted(fake.calls) == [("e0", "executor", 2, "executor"), ("e1", "executor", 2, "executor")]
    assert versions(svc) == {"p0": 4, "e0": 2, "e1": 2}
    assert (svc.target_for("p0"), svc.target_for("e0")) == (4, 2)  # the planner's, as its worker reports
    with pytest.raises(errors.SpecError) as exc:
        await sync.swap(protocol.SwapRequest(version=3))
    assert exc.value.field == "agent"


async def test_a_worker_being_swapped_is_not_told_the_target_until_its_swap_ends() -> None:
    svc = make({"w0": "pool"}, pool_agents=ONE)
    fake = FakeSwapper({"w0": [HANG]})
    sync = weightsync.WeightSync(svc, fake, apply_weights=True, sleep=no_sleep)
    task = asyncio.create_task(sync.swap(protocol.SwapRequest(version=5, timeout_s=0.01)))
    await fake.called.wait()
    # Told now, its agent would start a swap of its own and race placement's for the worker.
    assert svc.target_for("w0") is None
    await task
    assert svc.target_for("w0") == 5


def test_a_worker_that_registers_serving_an_old_version_takes_no_turn_until_it_loads_the_target() -> None:
    svc = make({"w0": "pool"}, pool_agents=ONE, alpha=1)
    report(svc, "w0", 4)  # a trainer's swapper moved it on: placement's target follows
    assert svc.target_for("w0") == 4
    svc.register_worker(pb.Worker(worker_id="w1", pool="pool", address="http://w1"))
    report(svc, "w1", 0)  # its engine (re)started on the checkpoint
    assert assignable(svc) == {"w0"} and svc.target_for("w1") == 4
    report(svc, "w1", 3)  # within the bound
    assert assignable(svc) == {"w0", "w1"}


def test_no_bound_without_a_staleness_setting() -> None:
    svc = make({"w0": "pool", "w1": "pool"}, pool_agents=ONE, alpha=None)
    report(svc, "w0", 9)
    assert assignable(svc) == {"w0", "w1"}


async def test_bad_requests_name_the_field_and_change_nothing() -> None:
    svc = make({"w0": "pool"}, pool_agents=ONE)
    sync = weightsync.WeightSync(svc, FakeSwapper(), apply_weights=True, sleep=no_sleep)
    await sync.swap(protocol.SwapRequest(version=3))
    for req, field in [
        (protocol.SwapRequest(version=-1), "version"),
        (protocol.SwapRequest(version=4, timeout_s=0), "timeout_s"),
        (protocol.SwapRequest(version=4, agent="critic"), "agent"),
    ]:
        with pytest.raises(errors.SpecError) as exc:
            await sync.swap(req)
        assert exc.value.field == field
    with pytest.raises(errors.Conflict, match="older"):
        await sync.swap(protocol.SwapRequest(version=2))
    assert svc.target_for("w0") == 3


async def test_prefetch_starts_on_every_worker_and_reports_failures() -> None:
    svc = make({"p0": "plan", "e0": "exec", "e1": "exec"}, pool_agents=TWO)
    fake = FakeSwapper()
    fake.fail_prefetch = {"e1"}
    sync = weightsync.WeightSync(svc, fake, apply_weights=True, sleep=no_sleep)
    result = await sync.prefetch(protocol.SwapRequest(version=7, agent="executor"))
    assert outcomes(result) == {"e0": "started", "e1": "failed"} and fake.prefetched == [("e0", 7)]
    assert svc.target_for("e0") is None  # a prefetch changes no target


async def test_a_worker_whose_agent_went_silent_is_not_waited_for_and_takes_no_turn() -> None:
    """Its pod was deleted: the swap neither tries it nor waits for it, and placement keeps turns off it
    until its agent reports again (then it is told the target and loads it like any other)."""
    clock = Clock()
    svc = make({"w0": "pool", "w1": "pool"}, pool_agents=ONE, lost_after_s=10.0, clock=clock)
    report(svc, "w0", 2)
    report(svc, "w1", 2)
    clock.now = 9.5
    report(svc, "w0", 2)
    assert not svc.lost("w1")  # silent 9.5 s, not more than 10
    clock.now = 11.0  # w1 silent 11 s; w0 reported 1.5 s ago
    assert svc.lost("w1") and not svc.lost("w0") and assignable(svc) == {"w0"}
    fake = FakeSwapper()
    sync = weightsync.WeightSync(svc, fake, apply_weights=True, sleep=clock.sleep)
    result = await sync.swap(protocol.SwapRequest(version=3))
    assert outcomes(result) == {"w0": "swapped", "w1": "lost"} and [c[0] for c in fake.calls] == ["w0"]
    assert "no load report for 11s" in {w.worker_id: w for w in result.workers}["w1"].error
    labels = {"pool": "pool", "outcome": "lost"}
    assert svc.registry.get_sample_value(metrics.PLACEMENT_WEIGHT_SWAP_FAILURES_TOTAL, labels) == 1
    assert svc.pool_versions() == {"pool": (3, 3, 3)}  # a deleted pod's version is no version served
    assert svc.target_for("w1") == 3
    report(svc, "w1", 3)  # back (an agent restart), on the target: it takes turns again
    assert assignable(svc) == {"w0", "w1"}


async def test_a_worker_lost_in_the_middle_of_its_swap_is_let_go_long_before_the_deadline() -> None:
    """A try to a deleted pod's address may never answer; placement cancels it once the agent is silent."""
    clock = Clock()
    svc = make({"w0": "pool", "w1": "pool"}, pool_agents=ONE, lost_after_s=10.0, clock=clock)
    fake = FakeSwapper({"w1": [HANG]})
    sync = weightsync.WeightSync(svc, fake, apply_weights=True, watch_s=0.005, sleep=clock.sleep)
    task = asyncio.create_task(sync.swap(protocol.SwapRequest(version=1, timeout_s=300.0)))
    while len(fake.calls) < 2:
        await fake.called.wait()
        fake.called.clear()
    clock.now = 11.0  # w1's agent (and its pod) went away; w0 still reports
    report(svc, "w0", 1)
    result = await asyncio.wait_for(task, timeout=5.0)
    assert outcomes(result) == {"w0": "swapped", "w1": "lost"}
    assert svc.target_for("w1") == 1  # no longer being swapped: told the target when it reports


async def test_an_unreachable_worker_is_reported_after_the_grace_not_at_the_deadline() -> None:
    clock = Clock()
    svc = make({"w0": "pool"}, pool_agents=ONE, clock=clock)
    steps: list[Step] = [errors.Unavailable("connection refused")] * 100
    fake = FakeSwapper({"w0": steps})
    sync = weightsync.WeightSync(
        svc, fake, apply_weights=True, unreachable_after_s=5.0, clock=clock, sleep=clock.sleep
    )
    result = await sync.swap(protocol.SwapRequest(version=1, timeout_s=300.0))
    assert outcomes(result) == {"w0": "unreachable"}
    assert len(fake.calls) == 11  # tries at 0, 0.5, ... 5.0 s (the retry wait passes on the clock)
    assert "unreachable for 5s" in result.workers[0].error and "connection refused" in result.workers[0].error
    assert svc.target_for("w0") == 1


async def test_prefetch_skips_a_lost_worker() -> None:
    clock = Clock()
    svc = make({"e0": "exec", "e1": "exec"}, pool_agents={"exec": "executor"}, lost_after_s=1.0, clock=clock)
    clock.now = 2.0
    report(svc, "e0", 0)
    fake = FakeSwapper()
    sync = weightsync.WeightSync(svc, fake, apply_weights=True)
    result = await sync.prefetch(protocol.SwapRequest(version=2))
    assert outcomes(result) == {"e0": "started", "e1": "lost"} and fake.prefetched == [("e0", 2)]


def test_lost_after_must_be_positive() -> None:
    with pytest.raises(errors.SpecError) as exc:
        make({}, pool_agents=ONE, lost_after_s=0.0)
    assert exc.value.field == "lost_after_s"


def test_pool_versions_are_exported_per_pool() -> None:
    svc = make({"p0": "plan", "e0": "exec", "e1": "exec"}, pool_agents=TWO)
    weightsync.WeightSync(svc, FakeSwapper(), apply_weights=False)
    report(svc, "e0", 2)
    report(svc, "e1", 1)

    def sample(pool: str, stat: str) -> float | None:
        return svc.registry.get_sample_value(
            metrics.PLACEMENT_POOL_WEIGHT_VERSION, {"pool": pool, "stat": stat}
        )

    assert (sample("exec", "min"), sample("exec", "max"), sample("exec", "target")) == (1, 2, 2)
    assert (sample("plan", "min"), sample("plan", "target")) == (0, None)


class FakePlacement:
    def __init__(self, outcomes_: Sequence[str]) -> None:
        self.outcomes = outcomes_
        self.calls: list[tuple[str, int, str]] = []

    async def prefetch_weights(self, version: int, *, agent: str = "") -> protocol.SwapResult:
        self.calls.append(("prefetch", version, agent))
        return protocol.SwapResult(version, agent, ())

    async def swap_weights(
        self, version: int, *, agent: str = "", timeout_s: float = 300.0
    ) -> protocol.SwapResult:
        self.calls.append(("swap", version, agent))
        workers = tuple(protocol.WorkerSwap(f"w{i}", "pool", o) for i, o in enumerate(self.outcomes))  # type: ignore[arg-type]
        return protocol.SwapResult(version, agent, workers)


async def test_cluster_swapper_commits_only_what_some_worker_serves() -> None:
    placement = FakePlacement(["swapped", "failed"])
    sync = swapper_mod.ClusterSwapper(placement, agent="planner")
    await sync.prefetch(3)
    await sync.swap(3)
    assert placement.calls == [("prefetch", 3, "planner"), ("swap", 3, "planner")]
    assert sync.last is not None and [w.outcome for w in sync.last.workers] == ["swapped", "failed"]
    with pytest.raises(swapper_mod.SwapIncomplete, match="w0: timeout"):
        await swapper_mod.ClusterSwapper(FakePlacement(["timeout"])).swap(4)
    with pytest.raises(swapper_mod.SwapIncomplete, match="no worker registered"):
        await swapper_mod.ClusterSwapper(FakePlacement([])).swap(4)


async def test_cluster_swapper_commits_past_workers_that_are_gone() -> None:
    """A deleted pod (``lost``) or an agent placement cannot reach (``unreachable``) loads the version
    itself when back: the trainer commits rather than holding the rollout suspended."""
    for away in (["lost"], ["unreachable", "lost"]):
        sync = swapper_mod.ClusterSwapper(FakePlacement(away))
        await sync.swap(5)
        assert sync.last is not None and [w.outcome for w in sync.last.workers] == away
    with pytest.raises(swapper_mod.SwapIncomplete, match="w1: failed"):
        await swapper_mod.ClusterSwapper(FakePlacement(["lost", "failed"])).swap(5)
