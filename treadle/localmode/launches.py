"""What local mode starts for a job: the job topology's processes (``treadle.topology``) on 127.0.0.1.

``launches`` turns each ``topology.Process`` of the job into the ``Launch``es local mode runs (one
per env server and per simulated worker where the job asks for replicas), adding local mode's own
part in one place (``deployment``): its ports, its counts, the run's token and Redis. A component of
the topology local mode does not run is in ``SUBSTITUTED``, with what stands in for it. Pure: the
ports are given (``allocate``), so a test builds the same list without starting anything
(``tests/unit/dataplane/test_topology.py`` holds it to the operator's rendered pods).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from treadle import topology
from treadle.api import env_vars
from treadle.localmode import plan as plan_mod

HOST = "127.0.0.1"
ENGINE_MODULE = "treadle.services.fakevllm"
SUBSTITUTED: Mapping[str, str] = {
    "vllm": f"a SIMULATED engine ({ENGINE_MODULE}) per worker, started before its agent",
    "feeder": "the run submits the plan's prompt groups itself (plan.groups)",
    "weights": "no weight store: the simulated trainer publishes no weights",
}
"""The topology's components local mode does not run, and what stands in for each."""


@dataclasses.dataclass(frozen=True)
class Launch:
    """One process local mode starts: ``python -m module --host 127.0.0.1 --port N *args *local_args``
    with ``env`` and ``local_env`` set on top of the machine's environment."""

    name: str
    """The run's name for it (``Stack.procs``, its log file): ``scheduler``, ``env-0``, ``agent-<worker>``."""
    component: str
    module: str
    port: int
    kind: str
    """How the stack sees it healthy: ``grpc`` or ``http``."""
    args: tuple[str, ...] = ()
    """The topology's."""
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """The topology's."""
    local_args: tuple[str, ...] = ()
    """Local mode's own (``deployment``)."""
    local_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Local mode's own (``deployment``)."""
    pool: str | None = None
    health_path: str = "/healthz"
    substitute: bool = False
    """Local mode's stand-in for a component of the topology (``SUBSTITUTED``), not the topology's."""

    def argv(self, python: str) -> list[str]:
        return [python, "-m", self.module, "--host", HOST, "--port", str(self.port), *self.args,
                *self.local_args]  # fmt: skip

    @property
    def environ(self) -> dict[str, str]:
        return {**self.env, **self.local_env}

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"


def names(plan: plan_mod.Plan, options: plan_mod.Options) -> list[str]:
    """The name of every process local mode starts, and ``metrics-<name>`` of each gRPC one."""
    out = ["reward"]
    for w in plan.workers:
        out += [f"engine-{w.worker_id}", f"agent-{w.worker_id}"]
    out += [f"env-{i}" for i in range(options.env_servers)]
    grpc = ["buffer", "placement", "scheduler"]
    return out + grpc + [f"metrics-{n}" for n in grpc]


def allocate(plan: plan_mod.Plan, options: plan_mod.Options, free_port: Callable[[], int]) -> dict[str, int]:
    """A distinct port for each of ``names``, all chosen before the first process starts: each is
    told the others' addresses."""
    out: dict[str, int] = {}
    for name in names(plan, options):
        port = free_port()
        while port in out.values():
            port = free_port()
        out[name] = port
    return out


def site(
    plan: plan_mod.Plan, options: plan_mod.Options, ports: Mapping[str, int], config_path: str
) -> topology.Site:
    """Where a local run is: every component on 127.0.0.1 at its port (the env servers' URLs
    comma-separated), the run's job file, and the job's name as its key prefix (its Redis keys)."""
    envs = ",".join(f"http://{HOST}:{ports[f'env-{i}']}" for i in range(options.env_servers))
    addresses = {c: f"{HOST}:{ports[c]}" for c in ("scheduler", "placement", "buffer")}
    addresses |= {"env": envs, "reward": f"http://{HOST}:{ports['reward']}"}
    return topology.Site(addresses=addresses, config_path=config_path, key_prefix=plan.job.name)


def deployment(
    proc: topology.Process, plan: plan_mod.Plan, ports: Mapping[str, int], *, worker: plan_mod.Worker | None
) -> tuple[str, ...]:
    """Local mode's own arguments of ``proc`` (its own variables are the run's, ``run_env``): what
    only local mode decides, in this one place.

    - gRPC services: ``--metrics-port`` (each its own; a pod's is the shared ``TREADLE_METRICS_PORT``).
    - scheduler: local mode's counts (``plan.counts``: fewer engines than the job's replicas).
    - placement: ``--no-apply-weights`` (simulated engines only take a moved worker's label).
    - agent: its simulated engine's URL and its worker id (a pod's are its own engine and its name),
      and ``--placement=`` (no self-registration: ``treadle.localmode.run.report_loads`` registers the
      workers and forwards their load, the agent's part in a cluster).
    """
    args: list[str] = []
    if proc.protocol == "grpc":
        args += ["--metrics-port", str(ports[f"metrics-{proc.component}"])]
    if proc.component == "scheduler":
        counts = plan.counts
        args += ["--max-tokens", str(counts.max_tokens), "--max-in-flight", str(counts.max_in_flight),
                 "--max-concurrent-generations", str(counts.max_concurrent_generations)]  # fmt: skip
    elif proc.component == "placement":
        args.append("--no-apply-weights")
    elif proc.component == "agent":
        assert worker is not None
        engine = f"http://{HOST}:{ports[f'engine-{worker.worker_id}']}"
        args += ["--engine-url", engine, "--worker-id", worker.worker_id, "--poll-interval-s", "0.2",
                 "--placement="]  # fmt: skip
    return tuple(args)


def run_env(*, token_file: str, redis_url: str) -> dict[str, str]:
    """The run's variables, every process's: its token file (as a pod's mounted Secret) and, with
    ``--redis``, the Redis its buffer, env servers (API quotas) and scheduler (DARTS) share. No
    ``TREADLE_NAMESPACE``: with it the scheduler would report on whatever cluster the kubeconfig names."""
    return {env_vars.TOKEN_FILE: token_file, **({env_vars.REDIS_URL: redis_url} if redis_url else {})}


def launches(
    plan: plan_mod.Plan,
    options: plan_mod.Options,
    where: topology.Site,
    ports: Mapping[str, int],
    *,
    local_env: Mapping[str, str],
) -> list[Launch]:
    """Every process of a local run of ``plan`` at ``where``, in the topology's start order;
    ``local_env``: ``run_env``."""
    out: list[Launch] = []
    for proc in topology.processes(plan.job, where):
        if proc.component == "vllm":
            out += [_engine(w, plan, options, ports) for w in plan.workers if w.pool == proc.pool]
        if proc.component in SUBSTITUTED:
            continue
        replicas: Sequence[tuple[str, plan_mod.Worker | None]]
        if proc.component == "agent":
            replicas = [(f"agent-{w.worker_id}", w) for w in plan.workers if w.pool == proc.pool]
        elif proc.component == "env":
            replicas = [(f"env-{i}", None) for i in range(options.env_servers)]
        else:
            replicas = [(proc.component, None)]
        for name, worker in replicas:
            args = deployment(proc, plan, ports, worker=worker)
            out.append(
                Launch(
                    name=name, component=proc.component, module=proc.module, port=ports[name],
                    kind=proc.protocol, args=proc.args, env=proc.env, local_args=args,
                    local_env=local_env, pool=proc.pool,
                )
            )  # fmt: skip
    return out


def _engine(
    w: plan_mod.Worker, plan: plan_mod.Plan, options: plan_mod.Options, ports: Mapping[str, int]
) -> Launch:
    args = ["--max-num-seqs", str(options.max_num_seqs), "--max-model-len", str(plan.max_model_len),
            "--step-ms", str(options.engine_step_ms),
            *(f"--tokens-for={pattern}={n}" for pattern, n in options.tokens_for)]  # fmt: skip
    name = f"engine-{w.worker_id}"
    return Launch(name=name, component="vllm", module=ENGINE_MODULE, port=ports[name], kind="http",
                  local_args=tuple(args), pool=w.pool, health_path="/health", substitute=True)  # fmt: skip
