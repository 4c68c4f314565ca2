"""Every example job reaches its pods once (the job file); every service configures itself as local mode does.

(a) No rendered ``TREADLE_*`` variable repeats a spec field: each is in ``env_vars.RENDERED`` (the
addresses, paths and identity a pod may carry), and none but the identity variables carries a value
of the spec. (b) Each service's configuration parsed from its rendered pod (env + the rendered
``job.json``) equals what local mode builds for the same job (``plan.make_plan``), given local mode's
counts (the only inputs a caller adds).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from treadle.api import env_vars, jobconfig, v1alpha1
from treadle.localmode import plan
from treadle.operator import config, render
from treadle.operator.render import common as render_common
from treadle.services import podenv
from treadle.services.buffer import __main__ as buffer_main
from treadle.services.placement import __main__ as placement_main
from treadle.services.reward import __main__ as reward_main
from treadle.services.scheduler import __main__ as scheduler_main

MANIFESTS = Path(__file__).parents[3] / "manifests"
JOBS = sorted([*(MANIFESTS / "examples").glob("*.yaml"), *(MANIFESTS / "local").glob("*.yaml")])


def load(path: Path) -> v1alpha1.RolloutJob:
    return v1alpha1.parse_job(yaml.safe_load(path.read_text()))


def pods(job: v1alpha1.RolloutJob, tmp_path: Path) -> dict[str, dict[str, str]]:
    """Each rendered container's env by name (``agent@<pool>`` per pool); the ConfigMap goes to tmp_path,
    the Secret to tmp_path/auth."""
    children = render.render_children(job, config.OperatorConfig())
    configmap = next(c for c in children if c["kind"] == "ConfigMap")
    for filename, text in configmap["data"].items():
        (tmp_path / filename).write_text(text)
    secret = next(c for c in children if c["kind"] == "Secret")
    (tmp_path / "auth").mkdir(exist_ok=True)
    for filename, text in secret["stringData"].items():
        (tmp_path / "auth" / filename).write_text(text)
    mounts = {render_common.CONFIG_MOUNT: str(tmp_path), render_common.AUTH_MOUNT: f"{tmp_path}/auth"}
    out: dict[str, dict[str, str]] = {}
    for child in children:
        if child["kind"] != "Deployment":
            continue
        pool = child["metadata"]["labels"].get(render_common.POOL_LABEL)
        for c in child["spec"]["template"]["spec"]["containers"]:
            env = {e["name"]: _mounted(e["value"], mounts) for e in c["env"]}
            out[f"{c['name']}@{pool}" if pool else c["name"]] = env
    return out


def _mounted(value: str, mounts: dict[str, str]) -> str:
    for mount, directory in mounts.items():
        value = value.replace(mount, directory)
    return value


def spec_values(node: Any) -> set[str]:
    """Every scalar of the spec as a variable would carry it."""
    if isinstance(node, dict):
        return set().union(*(spec_values(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(spec_values(v) for v in node))
    return {json.dumps(node) if isinstance(node, bool) else str(node)}


@pytest.mark.parametrize("path", JOBS, ids=lambda p: p.stem)
def test_no_job_setting_reaches_a_pod_twice(path: Path, tmp_path: Path) -> None:
    job = load(path)
    rendered = pods(job, tmp_path)
    spec = json.loads((tmp_path / "job.json").read_text())
    assert v1alpha1.parse_spec(spec) == job.spec  # the job file is the whole spec
    values = spec_values(spec)
    for container, env in rendered.items():
        ours = {name: value for name, value in env.items() if name.startswith("TREADLE_")}
        assert set(ours) <= env_vars.RENDERED, f"{container}: {sorted(set(ours) - env_vars.RENDERED)}"
        repeated = {n: v for n, v in ours.items() if n not in env_vars.IDENTITY and v in values}
        assert not repeated, f"{container} repeats spec values in variables: {repeated}"


@pytest.mark.parametrize("path", JOBS, ids=lambda p: p.stem)
def test_every_service_started_from_its_pod_configures_itself_as_local_mode_does(
    path: Path, tmp_path: Path
) -> None:
    job = load(path)
    local = plan.make_plan(job, plan.Options())
    counts = local.counts
    rendered = pods(job, tmp_path)
    # Whichever pod reads the job file, it reads the job local mode runs (counts aside).
    for container, env in rendered.items():
        if env_vars.CONFIG in env:
            assert podenv.job_config(env, **vars(counts)) == local.config, container

    flags = ["--max-tokens", str(counts.max_tokens), "--max-in-flight", str(counts.max_in_flight)]
    flags += ["--max-concurrent-generations", str(counts.max_concurrent_generations)]
    sched = scheduler_main.parse_args(flags, rendered["scheduler"])
    assert jobconfig.SchedulerConfig(tasks=sched.tasks, settings=sched.settings) == local.config.scheduler

    place = placement_main.parse_args([], rendered["placement"])
    rebalance = jobconfig.RebalanceConfig(
        interval_s=place.rebalance_interval_s, delta=place.rebalance_delta, rule=place.rebalance_rule,
        max_moves_per_poll=place.rebalance_step, settle_polls=place.rebalance_settle_polls,
    )  # fmt: skip
    placement = jobconfig.PlacementConfig(
        pools=place.pools, tasks=place.tasks, policy=place.policy, rebalance=rebalance,
        pool_agents=place.pool_agents, pool_shapes=place.pool_shapes, alpha=place.alpha,
    )  # fmt: skip
    assert placement == local.config.placement

    buf = buffer_main.parse_args([], rendered["buffer"])
    assert jobconfig.BufferConfig(alpha=buf.alpha, task_weights=buf.task_weights, agents=buf.agents) == (
        local.config.buffer
    )

    reward = podenv.job_config(rendered["reward"]).reward
    assert reward_main.endpoints(reward) == (
        local.config.reward.judge_url,
        local.config.reward.external_url,
    )

    # Each pool's sidecar is told which pool and agent it is, the one thing not in the job file.
    for pool in job.spec.pools:
        agent = rendered[f"agent@{pool.name}"]
        assert (agent[env_vars.POOL], agent[env_vars.AGENT]) == (
            pool.name,
            local.config.placement.pool_agents[pool.name],
        )
