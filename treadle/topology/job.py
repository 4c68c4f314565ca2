"""``processes``: a RolloutJob and its ``Site`` -> every process it runs, in start order."""

from __future__ import annotations

import math
from collections.abc import Mapping

from treadle.api import env_vars, v1alpha1
from treadle.topology.process import (
    COMPONENT_ADDRESSES,
    MODULES,
    PORTS,
    VLLM_MODULE,
    VLLM_WEIGHTS_ARGS,
    Process,
    Site,
)

REWARD_REQUESTS_PER_REPLICA = 32
_ADDRESS_VARS: Mapping[str, str] = {
    "scheduler": env_vars.SCHEDULER_ADDR,
    "placement": env_vars.PLACEMENT_ADDR,
    "buffer": env_vars.BUFFER_ADDR,
    "env": env_vars.ENV_URL,
    "reward": env_vars.REWARD_URL,
}


def job_env(job: v1alpha1.RolloutJob, site: Site) -> dict[str, str]:
    """What every process of the job is told: the job, its file, its key prefix and where the others are."""
    missing = [c for c in COMPONENT_ADDRESSES if c not in site.addresses]
    if missing:
        raise ValueError(f"the site names no address of {missing}")
    return {
        env_vars.JOB: job.name,
        env_vars.CONFIG: site.config_path,
        env_vars.KEY_PREFIX: site.key_prefix,
        **{_ADDRESS_VARS[c]: site.addresses[c] for c in COMPONENT_ADDRESSES},
    }


def reward_replicas(job: v1alpha1.RolloutJob) -> int:
    """Gateway replicas for the current demand: 0 when idle and scale-to-zero, up to maxReplicas."""
    reward = job.spec.reward
    raw = str(job.metadata.get("annotations", {}).get(v1alpha1.REWARD_DEMAND_ANNOTATION, "0"))
    demand = int(raw) if raw.isdigit() else 0
    idle = reward.min_replicas if reward.scale_to_zero else max(reward.min_replicas, 1)
    if demand == 0:
        return idle
    wanted = math.ceil(demand / REWARD_REQUESTS_PER_REPLICA)
    return min(reward.max_replicas, max(idle, 1, wanted))


def _service(
    component: str, env: Mapping[str, str], *, replicas: int, pool: str | None = None, metrics: bool = True
) -> Process:
    grpc = component in ("scheduler", "placement", "buffer", "weights")
    return Process(
        component=component, module=MODULES[component], port=PORTS[component],
        protocol="grpc" if grpc else "http", replicas=replicas, env=env, pool=pool, metrics=metrics,
    )  # fmt: skip


def _engine_args(agent: v1alpha1.Agent, pool: v1alpha1.Pool) -> tuple[str, ...]:
    return (
        "--model", agent.model,
        "--served-model-name", agent.name,
        "--tensor-parallel-size", str(pool.tensor_parallel_size),
        "--max-model-len", str(agent.max_model_len),
        "--dtype", agent.dtype,
        *VLLM_WEIGHTS_ARGS,
        *pool.engine.args,
    )  # fmt: skip


def processes(job: v1alpha1.RolloutJob, site: Site) -> list[Process]:
    """Every process of ``job`` at ``site``, in start order: a process comes after those it calls at
    startup (the reward gateway first: local mode asks it for its functions before the rest starts).

    Not here (yet): the job's trainer (``spec.trainer``), rendered by ``treadle.operator.render.trainer``.
    """
    spec = job.spec
    env = job_env(job, site)
    out = [_service("reward", env, replicas=reward_replicas(job))]
    if spec.weights.store == "mooncake":
        out.append(_service("weights", env, replicas=spec.weights.replicas, metrics=False))
    for pool in spec.pools:
        agent = next(a for a in spec.agents if a.name == pool.agent)
        out.append(
            Process(
                component="vllm", module=VLLM_MODULE, port=PORTS["vllm"], protocol="http",
                replicas=pool.replicas, args=_engine_args(agent, pool), env=env, pool=pool.name,
                metrics=False,
            )
        )  # fmt: skip
        identity = {env_vars.AGENT: agent.name, env_vars.POOL: pool.name}
        out.append(_service("agent", {**env, **identity}, replicas=pool.replicas, pool=pool.name))
    out.append(_service("env", env, replicas=spec.environment.replicas))
    # One each: a coordination service's state is per job and lives in its one process (or in Redis),
    # and two feeders would race on the job's position in Redis.
    for component in ("buffer", "placement", "scheduler", "feeder"):
        out.append(_service(component, env, replicas=1))
    return out
