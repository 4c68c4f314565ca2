"""Local mode's translation of multi-agent jobs: turn order, pool agents and instance shapes."""

from __future__ import annotations

from pathlib import Path

import yaml

from treadle.api import jobconfig, v1alpha1
from treadle.localmode import plan, run, trainer
from treadle.v1 import buffer_pb2, placement_pb2, scheduler_pb2

MANIFESTS = Path(__file__).resolve().parents[3] / "manifests"


def load(path: str) -> v1alpha1.RolloutJob:
    return v1alpha1.parse_job(yaml.safe_load((MANIFESTS / path).read_text()))


def test_two_agent_example_takes_turns_and_cannot_move_instances_across_shapes() -> None:
    cfg = plan.make_plan(load("examples/two-agent-flexmarl.yaml"), plan.Options(trajectories=32)).config
    (task,) = cfg.scheduler.tasks
    assert (task.agent, task.agents) == ("planner", ("planner", "executor"))
    assert cfg.buffer.agents == ["planner", "executor"]
    assert cfg.placement.pool_agents == {"planner": "planner", "executor": "executor"}
    # a 14B TP2 H800 planner instance is no 7B TP1 H20 executor instance: rebalancing never moves one
    assert cfg.placement.pool_shapes == {
        "planner": "Qwen/Qwen2.5-14B-Instruct/tp2/H800",
        "executor": "Qwen/Qwen2.5-7B-Instruct/tp1/H20",
    }


def test_rebalance_job_has_one_shape_and_a_skewed_start() -> None:
    p = plan.make_plan(
        load("local/two-agent-rebalance.yaml"), plan.Options(trajectories=64, max_workers_per_pool=3)
    )
    assert len(set(p.config.placement.pool_shapes.values())) == 1
    assert [w.pool for w in p.workers] == ["planner", "executor", "executor", "executor"]


def test_rebalancing_is_on_by_default_only_where_two_agents_share_a_shape() -> None:
    def interval(path: str, **rebalance: object) -> float:
        raw = yaml.safe_load((MANIFESTS / path).read_text())
        raw["spec"].setdefault("rollout", {})["rebalance"] = rebalance
        return plan.make_plan(
            v1alpha1.parse_job(raw), plan.Options(trajectories=8)
        ).config.placement.rebalance.interval_s

    assert interval("local/two-agent-rebalance.yaml") == 1.0  # the spec's default once the file's is dropped
    assert interval("examples/two-agent-flexmarl.yaml") == 0.0  # two shapes: nothing could move
    assert interval("examples/math-tool-h20.yaml") == 0.0  # one agent
    assert interval("local/two-agent-rebalance.yaml", enabled=False) == 0.0
    assert interval("examples/two-agent-flexmarl.yaml", enabled=True, intervalSeconds=2.5) == 2.5


def test_the_jobs_rebalance_settings_reach_placements_config() -> None:
    raw = yaml.safe_load((MANIFESTS / "local/two-agent-rebalance.yaml").read_text())
    raw["spec"]["rollout"]["rebalance"] = {
        "delta": 2.5, "rule": "literal", "intervalSeconds": 0.25, "maxMovesPerPoll": 0, "settlePolls": 7,
    }  # fmt: skip
    cfg = plan.make_plan(v1alpha1.parse_job(raw), plan.Options(trajectories=8)).config
    assert cfg.placement.rebalance == jobconfig.RebalanceConfig(
        interval_s=0.25, delta=2.5, rule="literal", max_moves_per_poll=0, settle_polls=7
    )


def test_single_agent_tasks_name_no_turn_agents() -> None:
    cfg = plan.make_plan(load("examples/math-tool-h20.yaml"), plan.Options(trajectories=8)).config
    assert all(t.agents == () and t.agent_of(1) == "" for t in cfg.scheduler.tasks)
    assert cfg.buffer.agents == []


def test_summary_shows_turns_per_agent_and_moves() -> None:
    stats = scheduler_pb2.SchedulerStats(submitted=2, completed=2, turns=5, turns_by_agent={"a": 3, "b": 2})
    pools = placement_pb2.PoolStateResponse(rebalance_moves=1)
    pools.agents.add(agent="a", instances=2, moved_in=1)
    pools.agents.add(agent="b", instances=1, moved_out=1)
    summary = run.summarize(
        stats, buffer_pb2.BufferStats(), trainer.TrainerLog(), [], elapsed=1.0, pools=pools
    )
    assert summary["turns_by_agent"] == {"a": 3, "b": 2} and summary["rebalance_moves"] == 1
    assert summary["agents"]["a"] == {"instances": 2, "moved_in": 1, "moved_out": 0}
    line = next(x for x in run.summary_lines(summary) if "agents:" in x)
    assert "a 3 turns, 2 workers at the end (+1/-0)" in line and "1 workers moved between agents" in line
