"""Services started from what the operator renders: env + ConfigMap -> the same configs local mode uses."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from treadle import errors
from treadle.api import env_vars, jobconfig, v1alpha1
from treadle.localmode import plan
from treadle.operator import config, render
from treadle.operator.render import common as render_common
from treadle.services import podenv
from treadle.services.buffer import __main__ as buffer_main
from treadle.services.env import __main__ as env_main
from treadle.services.placement import __main__ as placement_main
from treadle.services.reward import __main__ as reward_main
from treadle.services.scheduler import __main__ as scheduler_main
from treadle.services.scheduler import protocol as scheduler_protocol

MANIFESTS = Path(__file__).parents[3] / "manifests"
EXAMPLES = MANIFESTS / "examples"


def job(name: str = "math-tool-h20.yaml") -> v1alpha1.RolloutJob:
    return v1alpha1.parse_job(yaml.safe_load((EXAMPLES / name).read_text()))


def pod_env(tmp_path: Path, component: str, j: v1alpha1.RolloutJob | None = None) -> dict[str, str]:
    """The rendered container's env, with the ConfigMap's files written under tmp_path (and the
    Secret's under tmp_path/auth, as the pod mounts them)."""
    j = j or job()
    children = render.render_children(j, config.OperatorConfig())
    configmap = next(c for c in children if c["kind"] == "ConfigMap")
    for filename, text in configmap["data"].items():
        (tmp_path / filename).write_text(text)
    secret = next(c for c in children if c["kind"] == "Secret")
    (tmp_path / "auth").mkdir(exist_ok=True)
    for filename, text in secret["stringData"].items():
        (tmp_path / "auth" / filename).write_text(text)
    container: dict[str, Any] = next(
        c
        for child in children
        if child["kind"] == "Deployment"
        for c in child["spec"]["template"]["spec"]["containers"]
        if c["name"] == component
    )
    env = {e["name"]: e["value"] for e in container["env"]}
    return {
        k: v.replace(render_common.CONFIG_MOUNT, str(tmp_path)).replace(
            render_common.AUTH_MOUNT, f"{tmp_path}/auth"
        )
        for k, v in env.items()
    }


def test_job_config_is_local_modes_translation(tmp_path: Path) -> None:
    cfg = podenv.job_config(pod_env(tmp_path, "scheduler"))
    local = plan.make_plan(job(), plan.Options())
    tasks = cfg.scheduler.tasks
    assert tasks == [
        t.__class__(**{**t.__dict__, "max_tokens": tasks[0].max_tokens}) for t in local.config.scheduler.tasks
    ]
    assert (cfg.placement.pools, cfg.placement.tasks, cfg.buffer.task_weights) == (
        local.config.placement.pools,
        local.config.placement.tasks,
        local.config.buffer.task_weights,
    )
    assert (cfg.buffer.alpha, cfg.scheduler.settings.batch_size, cfg.placement.policy) == (
        1,
        128,
        "sticky-least-loaded",
    )
    # 4 replicas of the decode pool, each vLLM's default 256 sequences at once.
    assert cfg.scheduler.settings.max_concurrent_generations == 4 * 256


def test_every_coordination_service_starts_from_the_rendered_env(tmp_path: Path) -> None:
    sched = scheduler_main.parse_args(["--host", "0.0.0.0"], pod_env(tmp_path, "scheduler"))
    assert [t.name for t in sched.tasks] == ["gem-math"] and sched.settings.batch_size == 128
    assert sched.placement == "math-tool-placement.default.svc:50052"
    assert sched.buffer == "math-tool-buffer.default.svc:50053"
    assert sched.reward_url == "http://math-tool-reward.default.svc:8001"
    assert sched.env_urls == ["http://math-tool-env.default.svc:8000"]
    place = placement_main.parse_args([], pod_env(tmp_path, "placement"))
    assert place.pools == {"decode": "decode-heavy"} and place.policy == "sticky-least-loaded"
    assert place.tasks["gem-math"].affinity == "decode-heavy"
    buf = buffer_main.parse_args([], pod_env(tmp_path, "buffer"))
    assert buf.namespace == "default/math-tool" and buf.redis == config.OperatorConfig().redis_url
    assert (buf.alpha, buf.task_weights, buf.agents) == (1, {"gem-math": 1.0}, [])
    # A multi-agent job's buffer updates its agents together (FlexMARL's barrier).
    two = buffer_main.parse_args([], pod_env(tmp_path, "buffer", job("two-agent-flexmarl.yaml")))
    assert two.agents == ["planner", "executor"]


def test_every_coordination_service_serves_metrics_on_the_rendered_port(tmp_path: Path) -> None:
    port = config.PORTS["metrics"]
    for main in (scheduler_main, placement_main, buffer_main):
        component = main.PROG.rsplit(".", 1)[1]
        assert main.parse_args([], pod_env(tmp_path, component)).metrics_port == port
        # Local mode passes its own port; 0 turns the server off.
        assert main.parse_args(["--metrics-port", "0"], pod_env(tmp_path, component)).metrics_port == 0


def test_flags_override_the_environment(tmp_path: Path) -> None:
    env = pod_env(tmp_path, "buffer")
    buf = buffer_main.parse_args(["--redis", "", "--namespace", "x"], env)
    assert (buf.redis, buf.alpha, buf.namespace) == ("", 1, "x")
    sched = scheduler_main.parse_args(
        ["--placement", "p:1", "--max-in-flight", "7"], pod_env(tmp_path, "scheduler")
    )
    assert (sched.placement, sched.settings.alpha, sched.settings.max_in_flight) == ("p:1", 1, 7)


def test_the_scheduler_takes_several_env_servers_from_the_variable(tmp_path: Path) -> None:
    """Local mode's env servers, each on a port of its own, reach the scheduler as one variable."""
    env = pod_env(tmp_path, "scheduler") | {env_vars.ENV_URL: "http://127.0.0.1:1,http://127.0.0.1:2"}
    assert scheduler_main.parse_args([], env).env_urls == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert scheduler_main.parse_args(["--env-url", "http://e:3"], env).env_urls == ["http://e:3"]


def test_scheduler_knobs_the_job_has_no_field_for_are_flags(tmp_path: Path) -> None:
    env = pod_env(tmp_path, "scheduler")
    knobs = ["--worker-slots", "4", "--preemption-margin", "0.5", "--preemption-max-progress", "inf"]
    sched = scheduler_main.parse_args([*knobs, "--system-prompt", "Be brief."], env)
    # The rest is the job's, as without the flags.
    plain = scheduler_main.parse_args([], env)
    assert sched.settings == dataclasses.replace(
        plain.settings, worker_slots=4, preemption_margin=0.5, preemption_max_progress=float("inf")
    )
    assert sched.tasks == [dataclasses.replace(t, system_prompt="Be brief.") for t in plain.tasks]
    assert plain.settings.worker_slots == 0 and plain.tasks[0].system_prompt == ""


JOB_SETTING_FLAGS = {
    "scheduler": ["--tasks", "--settings"],
    "placement": ["--pools", "--tasks", "--policy", "--pool-agents", "--pool-shapes",
                  "--rebalance-interval-s", "--rebalance-delta", "--rebalance-settle-polls",
                  "--rebalance-rule", "--rebalance-step"],
    "buffer": ["--alpha", "--task-weights", "--agents"],
    "env": ["--warm-pool", "--cpu-per-action"],
    "reward": ["--judge-url", "--external-url", "--judge-model"],
}  # fmt: skip
"""Flags that once repeated a job setting: the job file is now the only way to give one."""


@pytest.mark.parametrize(
    ("service", "flag"), [(s, f) for s, flags in JOB_SETTING_FLAGS.items() for f in flags]
)
def test_a_flag_repeating_a_job_setting_is_refused(
    tmp_path: Path, service: str, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    start: dict[str, Callable[[list[str], dict[str, str]], object]] = {
        "scheduler": scheduler_main.parse_args, "placement": placement_main.parse_args,
        "buffer": buffer_main.parse_args, "env": env_main.main, "reward": reward_main.main,
    }  # fmt: skip
    with pytest.raises(SystemExit) as exited:
        start[service]([flag, "1"], pod_env(tmp_path, service if service != "reward" else "scheduler"))
    assert exited.value.code == 2
    assert f"unrecognized arguments: {flag} 1" in capsys.readouterr().err


def test_placement_takes_the_jobs_rebalancing(tmp_path: Path) -> None:
    raw = yaml.safe_load((MANIFESTS / "local" / "two-agent-rebalance.yaml").read_text())
    raw["spec"]["rollout"]["rebalance"] = {
        "delta": 3,
        "rule": "literal",
        "maxMovesPerPoll": 2,
        "settlePolls": 0,
    }
    env = pod_env(tmp_path, "placement", v1alpha1.parse_job(raw))
    cfg = placement_main.parse_args([], env)
    assert cfg.pool_agents == {"planner": "planner", "executor": "executor"}
    got = (cfg.rebalance_interval_s, cfg.rebalance_delta, cfg.rebalance_rule, cfg.rebalance_step)
    assert (*got, cfg.rebalance_settle_polls) == (1.0, 3.0, "literal", 2, 0)
    # A job whose agents have different shapes runs no rebalance loop unless it asks for one.
    assert (
        placement_main.parse_args(
            [], pod_env(tmp_path, "placement", job("two-agent-flexmarl.yaml"))
        ).rebalance_interval_s
        == 0
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"TREADLE_CONFIG": ""}, "TREADLE_CONFIG: not set"),
        ({"TREADLE_CONFIG": "/nonexistent/job.json"}, "TREADLE_CONFIG: cannot read"),
        ({"TREADLE_JOB": ""}, "TREADLE_JOB: not set"),
        (
            {"TREADLE_REWARD_URL": ""},
            "TREADLE_REWARD_URL: not set: pass --reward-url or set TREADLE_REWARD_URL",
        ),
        ({"TREADLE_METRICS_PORT": "http"}, "TREADLE_METRICS_PORT: must be a TCP port"),
    ],
    ids=["no-config", "unreadable", "no-job", "no-reward-url", "bad-metrics-port"],
)
def test_bad_environment_is_a_startup_error_naming_the_variable(
    tmp_path: Path, change: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    env = pod_env(tmp_path, "scheduler") | change
    with pytest.raises(SystemExit) as exited:
        scheduler_main.parse_args([], env)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_bad_job_json_names_the_field_inside_it(tmp_path: Path) -> None:
    env = pod_env(tmp_path, "scheduler")
    spec = json.loads((tmp_path / "job.json").read_text())
    spec["tasks"][0]["groupSize"] = 0
    (tmp_path / "job.json").write_text(json.dumps(spec))
    with pytest.raises(errors.SpecError) as raised:
        podenv.job_config(env)
    assert raised.value.field == "TREADLE_CONFIG:spec.tasks[0].groupSize"


def test_env_pod_refuses_an_environment_it_does_not_serve(tmp_path: Path) -> None:
    env_main.check_environments(podenv.job_config(pod_env(tmp_path, "env")).env.environments)  # math-tool
    with pytest.raises(errors.SpecError, match=r"spec\.tasks\.environment: this image serves no environment"):
        env_main.check_environments({"math-tool", "chess"})


def test_a_bound_host_is_advertised_as_is() -> None:
    assert podenv.advertised_host("127.0.0.1") == "127.0.0.1"


@pytest.mark.parametrize(
    ("url", "beside", "want"),
    [
        ("http://127.0.0.1:8000", "http://10.1.2.3:8200", "http://10.1.2.3:8000"),
        ("http://localhost:8000/", "http://10.1.2.3:8200", "http://10.1.2.3:8000/"),
        ("http://[::1]:8000", "http://[fd00::7]:8200", "http://[fd00::7]:8000"),
        ("http://engine.team-a.svc:8000", "http://10.1.2.3:8200", "http://engine.team-a.svc:8000"),
        ("http://127.0.0.1:8000", "http://127.0.0.1:8200", "http://127.0.0.1:8000"),
    ],
    ids=["pod-ip", "localhost", "ipv6", "not-loopback", "both-local"],
)
def test_a_loopback_engine_is_dialled_at_the_agents_host(url: str, beside: str, want: str) -> None:
    assert podenv.peer_url(url, beside=beside) == want


class Backlog:
    def __init__(self, values: list[int]) -> None:
        self.values = values

    def reward_backlog(self) -> int:
        return self.values.pop(0) if len(self.values) > 1 else self.values[0]

    progress = scheduler_protocol.Progress(version=3, step=3, mean_reward=0.5)
    tally = types.SimpleNamespace(max_staleness=1)

    def stats(self) -> str:
        return "the scheduler's stats"


class Reporter:
    namespace, job = "team-a", "math-tool"

    def __init__(self, want: int) -> None:
        self.reported: list[int] = []
        self.progress: list[scheduler_protocol.Progress] = []
        self.rollouts: list[tuple[str, int]] = []
        self.want = want
        self.enough = asyncio.Event()

    async def report_demand(self, pending: int) -> None:
        self.reported.append(pending)
        if len(self.reported) >= self.want:
            self.enough.set()

    async def report_progress(self, progress: scheduler_protocol.Progress) -> None:
        self.progress.append(progress)

    async def report_rollout(self, stats: str, *, max_staleness: int, now: float) -> None:
        self.rollouts.append((stats, max_staleness))


async def test_the_scheduler_reports_its_reward_backlog_until_stopped() -> None:
    reporter = Reporter(want=3)
    task = asyncio.create_task(
        scheduler_main.report(Backlog([5, 2, 0]), reporter, interval_s=0)  # type: ignore[arg-type]
    )
    await reporter.enough.wait()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert reporter.reported[:3] == [5, 2, 0]
    assert reporter.progress[:2] == [Backlog.progress] * 2  # the trainer's commit, on every tick
    assert reporter.rollouts[:2] == [("the scheduler's stats", 1)] * 2  # throttled by the reporter itself


def test_env_pod_serves_the_user_environments_its_job_names() -> None:
    user = "py:treadle.services.env.examples:SingleTurn"
    assert jobconfig.user_modules([user, "math-tool", "py:a.b:f", "py:a.b:g"]) == (
        "a.b",
        "treadle.services.env.examples",
    )
    env_main.check_environments({"math-tool", user}, jobconfig.user_modules([user]))
    with pytest.raises(errors.SpecError, match="not under an allowed module prefix"):
        env_main.check_environments({user})
    with pytest.raises(errors.SpecError, match="cannot import"):
        env_main.check_environments({"py:treadle.services.env.nosuch:X"}, ("treadle.services.env",))
