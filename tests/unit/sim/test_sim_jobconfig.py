"""The simulator and the live services get one job's configuration from the same translation.

For each shipped example (a multi-task job, a two-agent FlexMARL one), a scenario embedding it runs
the simulator; the job file of the same job starts the scheduler, placement and buffer as a pod
would (``python -m ...``'s ``parse_args``). The configs they hold must equal the simulator's
``jobconfig.JobConfig`` field for field, with the simulator's counts (its in-flight window, the
sequences all its engines hold at once) given to the scheduler as local mode gives its own.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from treadle.api import jobconfig
from treadle.services import podenv
from treadle.services.buffer import __main__ as buffer_main
from treadle.services.placement import __main__ as placement_main
from treadle.services.scheduler import __main__ as scheduler_main
from treadle.sim import engine, scenario

EXAMPLES = Path(__file__).parents[3] / "manifests" / "examples"
ADDRESSES = ["--reward-url", "http://r", "--placement", "p:1", "--buffer", "b:1", "--env-url", "http://e"]


@pytest.mark.parametrize("example", ["multi-task-mixed.yaml", "two-agent-flexmarl.yaml"])
def test_live_services_get_the_simulators_job_config(
    tmp_path: Path, workload: dict[str, Any], example: str
) -> None:
    raw = yaml.safe_load((EXAMPLES / example).read_text())
    sc = scenario.parse(
        {
            "version": 1,
            "name": "same-config",
            "job": raw,
            "simulation": {
                "steps": 1,
                "systems": ["rollart"],  # rollart keeps the job's own rollout fields
                "max_in_flight": 48,
                "max_seqs": 4,
                # the cost model's shape for every agent (the examples name models it does not know)
                "models": {a["name"]: "qwen3-8b" for a in raw["spec"]["agents"]},
                "workloads": {t["name"]: workload for t in raw["spec"]["tasks"]},
            },
        }
    )
    run = sc.config("rollart")
    sim = engine.Simulator(run).layout.config
    replicas = sum(p.replicas for p in run.job.spec.pools)
    assert sim.scheduler.settings.max_in_flight == 48
    assert sim.scheduler.settings.max_concurrent_generations == replicas * 4

    env = podenv.job_env(run.job, tmp_path)
    counts = ["--max-tokens", str(sim.scheduler.tasks[0].max_tokens), "--max-in-flight", "48"]
    counts += ["--max-concurrent-generations", str(replicas * 4)]
    sched = scheduler_main.parse_args([*counts, *ADDRESSES], env)
    assert jobconfig.SchedulerConfig(tasks=sched.tasks, settings=sched.settings) == sim.scheduler

    place = placement_main.parse_args([], env)
    rebalance = jobconfig.RebalanceConfig(
        interval_s=place.rebalance_interval_s, delta=place.rebalance_delta, rule=place.rebalance_rule,
        max_moves_per_poll=place.rebalance_step, settle_polls=place.rebalance_settle_polls,
    )  # fmt: skip
    placement = jobconfig.PlacementConfig(
        pools=place.pools, tasks=place.tasks, policy=place.policy, rebalance=rebalance,
        pool_agents=place.pool_agents, pool_shapes=place.pool_shapes, alpha=place.alpha,
    )  # fmt: skip
    assert placement == sim.placement

    buf = buffer_main.parse_args([], env)
    assert jobconfig.BufferConfig(alpha=buf.alpha, task_weights=buf.task_weights, agents=buf.agents) == (
        sim.buffer
    )
    # The env and reward servers' parts, and the whole, as every pod reads the job file.
    live = podenv.job_config(env, max_tokens=sim.scheduler.tasks[0].max_tokens, max_in_flight=48,
                             max_concurrent_generations=replicas * 4)  # fmt: skip
    assert (live.env, live.reward) == (sim.env, sim.reward)
    assert live == sim
    # Not vacuous: the simulator's tasks are the job's (agents in turn order, weights, members).
    assert [t.name for t in sim.scheduler.tasks] == [t["name"] for t in raw["spec"]["tasks"]]
    assert [dataclasses.astuple(t)[:3] for t in sim.scheduler.tasks] == [
        (t["name"], t["environment"], t["agents"][0]) for t in raw["spec"]["tasks"]
    ]
