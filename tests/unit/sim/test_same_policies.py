"""The live services and the simulator call the same ``treadle.policy`` functions, chosen by the same
RolloutJob fields.

One RolloutJob (``manifests/examples/multi-task-mixed.yaml``) feeds both paths: local mode's plan
builds the live placement and scheduler services from it, and a scenario embedding the same job
drives the simulator. Every policy entry point is replaced by a spy; both paths must hit each spy,
and the registry entries named by ``rollout.placementPolicy`` / ``rollout.schedulingPolicy`` must be
the very objects both hold.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from treadle import api
from treadle.localmode import plan as plan_mod
from treadle.policy import admission, affinity, registry
from treadle.services.placement import protocol as placement_protocol
from treadle.services.placement import service as placement_service
from treadle.services.scheduler import protocol as scheduler_protocol
from treadle.services.scheduler import service as scheduler_service
from treadle.sim import engine, scenario
from treadle.v1 import placement_pb2

JOB = Path(__file__).parents[3] / "manifests" / "examples" / "multi-task-mixed.yaml"
PLACEMENT, SCHEDULING = "least-loaded", "fifo"  # not the defaults: the fields must really select them


class Spies:
    def __init__(self) -> None:
        self.calls: collections.Counter[tuple[str, str]] = collections.Counter()
        self.path = "none"

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def spy(*args: Any, **kwargs: Any) -> Any:
            self.calls[(self.path, name)] += 1
            return fn(*args, **kwargs)

        return spy


@pytest.fixture
def spies(monkeypatch: pytest.MonkeyPatch) -> Spies:
    s = Spies()
    monkeypatch.setattr(
        registry,
        "PLACEMENT_POLICIES",
        {PLACEMENT: s.wrap("placement", registry.PLACEMENT_POLICIES[PLACEMENT])},
    )
    monkeypatch.setattr(
        registry,
        "SCHEDULING_POLICIES",
        {SCHEDULING: s.wrap("scheduling", registry.SCHEDULING_POLICIES[SCHEDULING])},
    )
    for module, name in [
        (affinity, "resolve"),
        (affinity, "eligible_pools"),
        (admission, "admit_groups"),
        (admission, "stale_in_flight"),
    ]:
        monkeypatch.setattr(module, name, s.wrap(name, getattr(module, name)))
    return s


def _job_raw() -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load(JOB.read_text())
    raw["spec"]["rollout"].update({"placementPolicy": PLACEMENT, "schedulingPolicy": SCHEDULING})
    return raw


async def test_live_services_and_simulator_share_policy_functions(
    spies: Spies, workload: dict[str, Any]
) -> None:
    raw = _job_raw()
    job = api.parse_job(raw)

    # --- live: local mode's translation of the job, then the placement and scheduler services
    spies.path = "live"
    plan = plan_mod.make_plan(job, plan_mod.Options(trajectories=8))
    placement = placement_service.PlacementService(
        pools=plan.config.placement.pools,
        tasks=plan.config.placement.tasks,
        policy=plan.config.placement.policy,
    )
    for w in plan.workers:
        placement.register_worker(
            placement_pb2.Worker(worker_id=w.worker_id, pool=w.pool, address=f"http://{w.worker_id}")
        )
    for task in plan.config.placement.tasks:
        placement.assign(placement_protocol.AssignRequest(trajectory_id=f"{task}-0", task=task, turn=0))
    # one generation slot, so waiting turns must be ordered by the scheduling policy; no trajectory
    # may start (max_in_flight 0), so submitting only consults admission and runs nothing
    live_settings = dataclasses.replace(
        plan.config.scheduler.settings, max_concurrent_generations=1, max_in_flight=0
    )
    scheduler = scheduler_service.SchedulerService(
        tasks={t.name: t for t in plan.config.scheduler.tasks},
        settings=live_settings,
        envs=[object()],  # type: ignore[list-item]
        agent_for=lambda address: None,  # type: ignore[arg-type,return-value]
        placement=None,  # type: ignore[arg-type]
        reward=None,  # type: ignore[arg-type]
        buffer=None,  # type: ignore[arg-type]
    )
    gate = scheduler.gate
    await gate.acquire("a", turn=0, task="frozenlake")
    waiters = [asyncio.create_task(gate.acquire(t, turn=1, task="gem-math")) for t in ("b", "c")]
    await asyncio.sleep(0)  # let both queue (no timing involved: one loop turn)
    gate.release("a")
    await waiters[0]
    gate.release("b")
    await waiters[1]
    await scheduler.submit([scheduler_protocol.PromptGroup(group_id="g0", task="gem-math", seed=1)])
    await scheduler.commit_version(1)

    # --- simulator: a scenario embedding the same job
    spies.path = "sim"
    sc = scenario.parse(
        {
            "version": 1,
            "name": "same-policies",
            "job": raw,
            "simulation": {
                "steps": 2,  # a version commit happens between the steps
                "systems": ["rollart"],  # rollart keeps the job's own policy fields
                "max_in_flight": 64,
                "max_seqs": 2,  # turns queue at workers, so the scheduling policy orders them
                "workloads": {t["name"]: workload for t in raw["spec"]["tasks"]},
            },
        }
    )
    sim = engine.Simulator(sc.config("rollart"))
    sim.run()

    # the very registry entries named by the job fields, in both
    assert placement.policy is registry.PLACEMENT_POLICIES[PLACEMENT] is sim.placer.place
    assert gate.policy is registry.SCHEDULING_POLICIES[SCHEDULING] is sim.schedule
    for name in ("placement", "scheduling", "resolve", "eligible_pools", "admit_groups", "stale_in_flight"):
        assert spies.calls[("live", name)] > 0, f"live path never called {name}"
        assert spies.calls[("sim", name)] > 0, f"simulator never called {name}"
