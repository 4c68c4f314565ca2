"""The operator's rendered pods and local mode's processes come from one job topology (``treadle.topology``).

For each example job: the operator renders its children, and local mode builds the processes it would
start for the same job at the same site (the cluster's addresses, job file and key prefix:
``render.common.site``), starting nothing. Per component, module, arguments and the topology's
environment must be equal; each side's own part (``render.common.deployment_env`` and the pod's own
wiring; ``localmode.launches.deployment`` and ``run_env``) is left out, and every component the
operator runs that local mode does not is one ``launches.SUBSTITUTED`` names.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from treadle import topology
from treadle.api import env_vars, v1alpha1
from treadle.localmode import launches, plan
from treadle.operator import config, render
from treadle.operator.render import common

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "manifests" / "examples").glob("*.yaml"))
CFG = config.OperatorConfig(redis_password="admin")  # every deployment variable the operator writes
POD_WIRING = frozenset({env_vars.ENGINE_URL, env_vars.AGENT_STATE, "MC_TCP_BIND_ADDRESS"})
"""Variables a pod sets for its own containers (the engine beside the agent, the pod's state
directory, the Mooncake store's bind address): the pod's, not the job's."""


@dataclasses.dataclass(frozen=True)
class Seen:
    """What a process runs, as either side would start it: the part the topology owns."""

    module: str
    args: tuple[str, ...]
    env: Mapping[str, str]


def load(path: Path) -> v1alpha1.RolloutJob:
    doc = yaml.safe_load(path.read_text())
    doc["metadata"] |= {"namespace": "team-a", "uid": "0000-uid-" + path.stem}
    return v1alpha1.parse_job(doc)


def rendered(job: v1alpha1.RolloutJob) -> dict[tuple[str, str | None], Seen]:
    """(component, pool) -> what the operator's containers run (the trainer is not in the topology)."""
    cluster = set(common.deployment_env(job, CFG)) | POD_WIRING
    out: dict[tuple[str, str | None], Seen] = {}
    for child in render.render_children(job, CFG):
        if child["kind"] != "Deployment":
            continue
        pool = child["spec"]["template"]["metadata"]["labels"].get(common.POOL_LABEL)
        for c in child["spec"]["template"]["spec"]["containers"]:
            argv = [*c["command"], *c.get("args", ())]
            assert argv[:2] == ["python", "-m"] and argv[3:5] == ["--host", "0.0.0.0"], argv
            assert argv[5:7] == ["--port", str(config.PORTS[c["name"]])], argv
            env = {e["name"]: e["value"] for e in c["env"] if e["name"].startswith("TREADLE_")}
            own = {k: v for k, v in env.items() if k not in cluster}
            out[(c["name"], pool)] = Seen(argv[2], tuple(argv[7:]), own)
    return out


def local(job: v1alpha1.RolloutJob, where: topology.Site | None = None) -> dict[tuple[str, str | None], Seen]:
    """(component, pool) -> what local mode starts (at ``where``, else at its own site), each
    replica the same."""
    options = plan.Options(env_servers=2)
    p = plan.make_plan(job, options)
    ports = launches.allocate(p, options, itertools.count(20000).__next__)
    where = where or launches.site(p, options, ports, "/run/job.json")
    out: dict[tuple[str, str | None], Seen] = {}
    for launch in launches.launches(p, options, where, ports, local_env={env_vars.TOKEN_FILE: "/run/t"}):
        if launch.substitute:
            assert launch.component in launches.SUBSTITUTED
            continue
        seen = Seen(launch.module, launch.args, dict(launch.env))
        assert out.setdefault((launch.component, launch.pool), seen) == seen, launch.name
    return out


def differences(cluster: Mapping[Any, Seen], here: Mapping[Any, Seen]) -> list[str]:
    """What differs between the operator's processes and local mode's (those local mode substitutes aside)."""
    out = [f"{key}: local mode only" for key in here.keys() - cluster.keys()]
    for key, seen in cluster.items():
        if key not in here:
            if key[0] not in launches.SUBSTITUTED:
                out.append(f"{key}: the operator's only")
        elif seen != here[key]:
            out.append(f"{key}: rendered {seen}, local {here[key]}")
    return out


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_rendered_pods_and_local_processes_come_from_one_topology(path: Path) -> None:
    job = load(path)
    assert differences(rendered(job), local(job, common.site(job))) == []


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_local_mode_at_its_own_site_sets_the_same_variables(path: Path) -> None:
    """At its own site local mode's values differ (its addresses, its job file, its key prefix), not
    which variables a process gets, nor its module, arguments or identity."""
    job = load(path)
    cluster, here = rendered(job), local(job)
    site_vars = {env_vars.CONFIG, env_vars.KEY_PREFIX, env_vars.SCHEDULER_ADDR, env_vars.PLACEMENT_ADDR,
                 env_vars.BUFFER_ADDR, env_vars.ENV_URL, env_vars.REWARD_URL}  # fmt: skip
    for key, seen in here.items():
        other = cluster[key]
        assert (seen.module, seen.args, seen.env.keys()) == (other.module, other.args, other.env.keys())
        assert {k: v for k, v in seen.env.items() if k not in site_vars} == {
            k: v for k, v in other.env.items() if k not in site_vars
        }


def test_a_process_started_on_one_side_only_or_differently_is_caught() -> None:
    job = load(EXAMPLES[0])
    cluster, here = rendered(job), local(job, common.site(job))
    assert differences(cluster, here) == []
    extra = dict(here) | {("cache", None): Seen("treadle.services.cache", (), {})}
    assert differences(cluster, extra) == ["('cache', None): local mode only"]
    missing = {k: v for k, v in here.items() if k[0] != "reward"}
    assert differences(cluster, missing) == ["('reward', None): the operator's only"]
    key = ("scheduler", None)
    flagged = dict(here) | {key: dataclasses.replace(here[key], args=("--reward-url", "http://x"))}
    env = dict(here) | {key: dataclasses.replace(here[key], env={**here[key].env, env_vars.POOL: "p"})}
    module = dict(here) | {key: dataclasses.replace(here[key], module="treadle.services.other")}
    for changed in (flagged, env, module):
        assert [d.split(":")[0] for d in differences(cluster, changed)] == [str(key)]


def test_every_process_of_the_topology_is_rendered_once() -> None:
    """Every process of the topology is a container of the operator's, with the process's replicas."""
    for path in EXAMPLES:
        job = load(path)
        children = {common.key(c): c for c in render.render_children(job, CFG)}
        procs = topology.processes(job, common.site(job))
        assert len({(p.component, p.pool) for p in procs}) == len(procs)
        assert {(p.component, p.pool) for p in procs} == rendered(job).keys()
        for p in procs:
            name = common.child_name(job, "pool", p.pool) if p.pool else common.child_name(job, p.component)
            replicas = 0 if job.spec.suspend else p.replicas
            assert children[("Deployment", name)]["spec"]["replicas"] == replicas


def test_local_mode_starts_the_topology_in_its_order_with_its_own_part_apart() -> None:
    job = load(EXAMPLES[0])  # math-tool-h20: one pool of 4 replicas, 2 simulated here
    options = plan.Options(env_servers=2)
    p = plan.make_plan(job, options)
    repeats = itertools.chain([20000, 20000, 20000], itertools.count(20001))
    ports = launches.allocate(p, options, repeats.__next__)
    assert len(set(ports.values())) == len(ports)  # a port the OS handed out twice is asked for again
    where = launches.site(p, options, ports, "/run/job.json")
    started = launches.launches(p, options, where, ports, local_env={env_vars.TOKEN_FILE: "/run/t"})
    assert [launch.name for launch in started] == [
        "reward", "engine-decode-0", "engine-decode-1", "agent-decode-0", "agent-decode-1", "env-0", "env-1",
        "buffer", "placement", "scheduler",
    ]  # fmt: skip
    by_name = {launch.name: launch for launch in started}
    scheduler = by_name["scheduler"]
    assert (
        scheduler.env[env_vars.ENV_URL]
        == f"http://127.0.0.1:{ports['env-0']},http://127.0.0.1:{ports['env-1']}"
    )
    assert scheduler.local_args[:2] == ("--metrics-port", str(ports["metrics-scheduler"]))
    assert "--max-tokens" in scheduler.local_args and scheduler.args == ()
    agent = by_name["agent-decode-1"]
    assert agent.local_args[:4] == ("--engine-url", by_name["engine-decode-1"].url, "--worker-id", "decode-1")
    assert agent.environ[env_vars.TOKEN_FILE] == "/run/t" and agent.env[env_vars.POOL] == "decode"
