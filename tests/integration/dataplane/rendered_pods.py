"""Run what the operator renders as local processes: the parts the rendered-pod tests share.

Used by ``test_operator_rendered_stack`` and ``test_trainer_job_rendered``: a job's containers by
name, its ConfigMap written where the pods would see it, the rewriting of what only a cluster
provides (in-cluster addresses to free 127.0.0.1 ports, ``0.0.0.0`` to 127.0.0.1, ``python`` to this
interpreter), and the launch of a one-pool job's services; everything else is taken verbatim from
the pure renderers.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from treadle import auth
from treadle.api import env_vars, v1alpha1
from treadle.localmode import stack as stack_mod
from treadle.operator import config
from treadle.operator.render import common as render_common
from treadle.testing import procs


def containers(children: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Container by name across the Deployments (component names are unique in one job)."""
    out: dict[str, dict[str, Any]] = {}
    for child in children:
        if child["kind"] == "Deployment":
            for c in child["spec"]["template"]["spec"]["containers"]:
                out[c["name"]] = c
    return out


def mount_configmap(children: list[dict[str, Any]], tmp_path: Path) -> Path:
    """The job's ConfigMap written as files, where the pods would see it mounted, and its Secret (the
    token, the Redis password) in ``auth/`` under it (``Rewriter`` points the pods there)."""
    config_dir = tmp_path / "etc-treadle"
    config_dir.mkdir()
    configmap = next(c for c in children if c["kind"] == "ConfigMap")
    for filename, text in configmap["data"].items():
        (config_dir / filename).write_text(text)
    secret = next(c for c in children if c["kind"] == "Secret")
    (config_dir / "auth").mkdir()
    for filename, text in secret["stringData"].items():
        (config_dir / "auth" / filename).write_text(text)
    return config_dir


class Rewriter:
    """In-cluster address -> 127.0.0.1 with a free port, the same for every reference to it."""

    def __init__(self, job: v1alpha1.RolloutJob, *, config_dir: Path, redis_url: str) -> None:
        ep = render_common.endpoints(job)
        self.ports = {name: procs.free_port() for name in config.PORTS}
        self.token = (config_dir / "auth" / auth.TOKEN_KEY).read_text()
        """The job's token, as its Secret holds it: what a caller from the job's pods sends."""
        self.subs: dict[str, str] = {
            render_common.CONFIG_MOUNT: str(config_dir),
            render_common.AUTH_MOUNT: str(config_dir / "auth"),
            "redis://placeholder": redis_url,
        }
        for name in (*render_common.COORDINATION, "weights"):
            self.subs[ep[name]] = f"127.0.0.1:{self.ports[name]}"
        for name in ("env", "reward"):
            self.subs[ep[name]] = f"http://127.0.0.1:{self.ports[name]}"
        self.subs[f"127.0.0.1:{config.PORTS['vllm']}"] = f"127.0.0.1:{self.ports['vllm']}"
        self.metrics: dict[str, int] = {}
        """Container name -> the free port its ``TREADLE_METRICS_PORT`` became (a pod has a network of
        its own, processes on one host need a port each)."""

    def value(self, text: str) -> str:
        for old, new in self.subs.items():
            text = text.replace(old, new)
        return text

    def command(self, container: dict[str, Any]) -> tuple[list[str], int]:
        argv = [*container["command"], *container.get("args", [])]
        assert argv[0] == "python" and argv[argv.index("--host") + 1] == "0.0.0.0"
        port = int(argv[argv.index("--port") + 1])
        component = next(name for name, p in config.PORTS.items() if p == port)
        argv[0] = sys.executable
        argv[argv.index("--host") + 1] = "127.0.0.1"
        argv[argv.index("--port") + 1] = str(self.ports[component])
        return argv, self.ports[component]

    def env(self, container: dict[str, Any]) -> dict[str, str]:
        assert all("value" in e for e in container["env"]), "only literal values are rewritable"
        env = {e["name"]: self.value(e["value"]) for e in container["env"]}
        if env_vars.METRICS_PORT in env:
            env[env_vars.METRICS_PORT] = str(self.metrics.setdefault(container["name"], procs.free_port()))
        return env


async def launch_rendered(
    stack: stack_mod.Stack,
    rw: Rewriter,
    by_name: dict[str, dict[str, Any]],
    tmp_path: Path,
    *,
    scheduler_env: Mapping[str, str] | None = None,
) -> tuple[int, int]:
    """Every rendered service container of a one-pool job but the feeder (and a trainer), the vLLM one
    replaced by the SIMULATED engine; returns the agent's and the scheduler's ports. ``scheduler_env``
    adds to the scheduler's rendered environment what a pod gets from elsewhere (its credentials)."""
    # The order a cluster converges to; each process is started from its rendered container.
    for name in ("buffer", "placement", "env", "reward"):
        c = by_name[name]
        argv, port = rw.command(c)
        if name == "placement":
            # Its swaps reach the SIMULATED engine below, which takes version labels but no weights.
            argv = [*argv, "--no-apply-weights"]
        kind = "grpc" if name in render_common.COORDINATION else "http"
        await stack.launch(name, argv, port=port, kind=kind, env=rw.env(c))
    vllm = by_name["vllm"]
    assert vllm["command"] == ["python", "-m", config.VLLM_MODULE]  # replaced by the simulated engine
    max_len = vllm["args"][vllm["args"].index("--max-model-len") + 1]
    engine_port = rw.ports["vllm"]
    await stack.launch(
        "engine", [sys.executable, "-m", "treadle.services.fakevllm", "--host", "127.0.0.1",
                   "--port", str(engine_port), "--max-model-len", max_len],
        port=engine_port, kind="http", health_path="/health",
    )  # fmt: skip
    agent_argv, agent_port = rw.command(by_name["agent"])
    agent_env = rw.env(by_name["agent"])
    assert agent_env["TREADLE_ENGINE_URL"] == f"http://127.0.0.1:{engine_port}"
    agent_env["TREADLE_AGENT_STATE"] = str(tmp_path / "agent.json")  # the pod's emptyDir
    await stack.launch("agent", agent_argv, port=agent_port, kind="http", env=agent_env)
    sched_argv, sched_port = rw.command(by_name["scheduler"])
    sched_env = rw.env(by_name["scheduler"]) | dict(scheduler_env or {})
    await stack.launch("scheduler", sched_argv, port=sched_port, kind="grpc", env=sched_env)
    return agent_port, sched_port
