"""Local mode's translation of a RolloutJob into service configs, on the shipped examples."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from treadle.api import jobconfig, v1alpha1
from treadle.errors import SpecError
from treadle.localmode import plan, run, trainer
from treadle.services.reward import __main__ as reward_main
from treadle.v1 import buffer_pb2, scheduler_pb2

EXAMPLES = Path(__file__).resolve().parents[3] / "manifests" / "examples"


def load(name: str) -> v1alpha1.RolloutJob:
    return v1alpha1.parse_job(yaml.safe_load((EXAMPLES / name).read_text()))


def test_math_tool_example() -> None:
    job = load("math-tool-h20.yaml")
    p = plan.make_plan(job, plan.Options(trajectories=256))
    (task,) = p.config.scheduler.tasks
    assert (task.name, task.env, task.reward_fn) == ("gem-math", "math-tool", job.spec.tasks[0].reward)
    # groupSize 8 + redundancy 0.25 -> 10 members per group; ceil(256 / 10) = 26 groups
    assert (task.members, task.max_turns) == (10, 4)
    assert (len(p.groups), p.trajectories) == (26, 260)
    assert p.groups[0] == ("gem-math-0", "gem-math", 0)
    assert [w.worker_id for w in p.workers] == ["decode-0", "decode-1"]  # 4 replicas, 2 simulated here
    assert p.replicas_in_job == {"decode": 4}
    cfg = p.config
    settings = cfg.scheduler.settings
    assert (settings.batch_size, cfg.buffer.alpha, settings.alpha, settings.batch_size) == (128, 1, 1, 128)
    assert settings.max_concurrent_generations == 2 * 256
    assert (
        settings.scheduling_policy == "progressive-priority" and cfg.placement.policy == "sticky-least-loaded"
    )
    assert cfg.placement.pools == {"decode": "decode-heavy"}


def test_multi_task_groups_follow_the_weights() -> None:
    p = plan.make_plan(load("multi-task-mixed.yaml"), plan.Options(trajectories=64))
    by_task: dict[str, int] = {}
    for _, task, _ in p.groups:
        by_task[task] = by_task.get(task, 0) + 1
    # weights 2 : 1 : 1 over groups of 8 -> ceil(32/8), ceil(16/8), ceil(16/8)
    assert by_task == {"gem-math": 4, "frozenlake": 2, "mixed-auto": 2}
    assert p.config.buffer.task_weights == {"frozenlake": 1.0, "gem-math": 2.0, "mixed-auto": 1.0}
    assert p.config.placement.tasks["mixed-auto"].affinity == "auto"
    assert [w.pool for w in p.workers] == ["prefill", "prefill", "decode", "decode"]


def test_bad_options_name_the_flag() -> None:
    with pytest.raises(SpecError) as err:
        plan.make_plan(load("math-tool-h20.yaml"), plan.Options(trajectories=0))
    assert err.value.field == "--trajectories"


def test_progress_and_summary_say_simulated() -> None:
    stats = scheduler_pb2.SchedulerStats(submitted=10, completed=6, failed=1, in_flight=3, turns=20,
                                         stage_seconds={"generation": 3.0, "environment": 1.0})  # fmt: skip
    line = run.progress_line(stats, elapsed=2.0, total=10, rewards=[1.0, 0.0])
    assert line.startswith("[SIMULATED ENGINE]") and "done 7/10" in line and "reward 0.500" in line
    assert "gen 75%" in line and "env 25%" in line
    summary = run.summarize(stats, buffer_pb2.BufferStats(), trainer.TrainerLog(), [], elapsed=2.0)
    assert summary["adds_up"] and summary["unfinished"] == 3
    assert all(line.startswith("[SIMULATED ENGINE]") for line in run.summary_lines(summary))


@pytest.mark.parametrize(
    ("reward", "urls", "model"),
    [
        ({"type": "rule"}, (None, None), None),
        ({"type": "external", "url": "http://scorer:9000/score"}, (None, "http://scorer:9000/score"), None),
        ({"type": "llm-judge", "url": "http://judge:8000", "judgeModel": "qwen-judge"},
         ("http://judge:8000", None), "qwen-judge"),
    ],
    ids=["rule", "external", "llm-judge"],
)  # fmt: skip
def test_the_reward_gateway_gets_the_jobs_scorer(
    reward: dict[str, str], urls: tuple[str | None, str | None], model: str | None
) -> None:
    cfg = jobconfig.reward_config(v1alpha1.Reward.model_validate(reward))
    assert reward_main.endpoints(cfg) == urls
    assert cfg.judge_model == model


def test_local_modes_rebalance_interval_is_written_into_the_job() -> None:
    job = load("two-agent-flexmarl.yaml")  # agents of different shapes: no rebalancing of its own
    assert plan.make_plan(job, plan.Options()).config.placement.rebalance.interval_s == 0
    every = plan.make_plan(job, plan.Options(rebalance_interval_s=0.2))
    assert every.config.placement.rebalance.interval_s == 0.2
    assert every.job.spec.rollout.rebalance.interval_seconds == 0.2  # the job file placement reads
    rebalancing = v1alpha1.parse_job(
        yaml.safe_load((EXAMPLES.parent / "local" / "two-agent-rebalance.yaml").read_text())
    )
    assert plan.make_plan(rebalancing, plan.Options()).config.placement.rebalance.interval_s == 0.5
    never = plan.make_plan(rebalancing, plan.Options(rebalance_interval_s=0))
    assert never.config.placement.rebalance.interval_s == 0
    with pytest.raises(SpecError) as raised:
        plan.make_plan(job, plan.Options(rebalance_interval_s=0.01))
    assert raised.value.field == "--rebalance-interval"
