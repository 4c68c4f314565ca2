"""``python -m treadle.services.scheduler``: run the scheduler against env, reward, placement and buffer.

A pod started by the operator (and local mode, the same way) takes its tasks and settings from the
job file and the addresses from ``TREADLE_*`` (``treadle.services.podenv``); a process started by
hand (tests, benchmarks, ``treadle train``) writes a job file too (``podenv.job_env``). Flags give
only what the RolloutJob has no field for: addresses, counts and a few scheduling knobs. Agents
are reached at the addresses placement hands out. In a cluster (``jobreport.JobReporter.from_env``)
the scheduler also reports on its RolloutJob every ``REPORT_INTERVAL_S`` how many trajectories wait
for or are in reward scoring, which the operator turns into reward gateway replicas, and the
trainer's latest commit (version, step, mean reward), which the job's status shows.

Env servers: each ``--env-url`` (the env headless Service) is resolved to one URL per pod address,
at start and again every ``--env-resolve-interval-s`` (``refresh_envs``): a new pod gets new
trajectories from then on, a gone pod's client gets no new session and is closed once its open
sessions have ended (``env_client.EnvPool``). A resolution that fails keeps the servers known.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import logging
import os
import socket
import urllib.parse
from collections.abc import Callable, Mapping, Sequence

from treadle import errors
from treadle.api import env_vars, jobconfig
from treadle.services import podenv, runtime
from treadle.services.agent import client as agent_client
from treadle.services.buffer import client as buffer_client
from treadle.services.env import client as env_client
from treadle.services.grpcutil import server as grpcutil_server
from treadle.services.placement import client as placement_client
from treadle.services.reward import client as reward_client
from treadle.services.scheduler import darts_store, grpc_server, jobreport, journal, protocol, service

PROG = "python -m treadle.services.scheduler"
REPORT_INTERVAL_S = 2.0
CONSUMED_INTERVAL_S = 2.0
"""How often the scheduler reads how much the trainer has taken from the buffer (``follow_consumption``)."""
ENV_RESOLVE_INTERVAL_S = 10.0
KNOBS = ("worker_slots", "preemption_margin", "preemption_max_progress")
"""``jobconfig.Settings`` fields given as flags: the job has no field for them."""
log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Config:
    host: str
    port: int
    metrics_port: int
    tasks: list[jobconfig.TaskConfig]
    settings: jobconfig.Settings
    env_urls: list[str]
    env_resolve_interval_s: float
    reward_url: str
    placement: str
    buffer: str
    redis: str = ""
    token: str | None = None
    """The job's token (``treadle.auth``): required of callers, sent to every service."""
    """Where DARTS tasks keep their length statistics (empty: in memory, lost on restart)."""
    namespace: str = "default"


def parse_args(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> Config:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50051)
    p.add_argument(
        "--metrics-port", type=int, help=f"Prometheus /metrics port (${env_vars.METRICS_PORT}; 0: none)"
    )
    # What only the caller knows (local mode passes its own); unset, a cluster's (podenv.job_config).
    p.add_argument("--max-tokens", type=int, help="tokens per turn at most")
    p.add_argument("--max-in-flight", type=int, help="trajectories in flight at most")
    p.add_argument("--max-concurrent-generations", type=int, help="turns generating at once at most")
    # Knobs the RolloutJob has no field for (benchmarks set them); unset: jobconfig.Settings' defaults.
    p.add_argument("--worker-slots", type=int, help="turns generating at once per worker (0: one gate)")
    p.add_argument("--preemption-margin", type=float, help="preemptive policies: the margin to preempt")
    p.add_argument("--preemption-max-progress", type=float, help="preemptive policies: preempt until")
    p.add_argument("--system-prompt", help="the system message every task's trajectories open with")
    p.add_argument(
        "--env-url", action="append", help=f"environment server base URL, repeatable (${env_vars.ENV_URL})"
    )
    p.add_argument(
        "--env-resolve-interval-s", type=float, default=ENV_RESOLVE_INTERVAL_S,
        help="seconds between resolutions of the env URLs into env pods (0: only at start)",
    )  # fmt: skip
    p.add_argument("--reward-url", help=f"reward gateway base URL (${env_vars.REWARD_URL})")
    p.add_argument("--placement", help=f"placement gRPC address host:port (${env_vars.PLACEMENT_ADDR})")
    p.add_argument("--buffer", help=f"buffer gRPC address host:port (${env_vars.BUFFER_ADDR})")
    p.add_argument("--redis", help=f"Redis URL of DARTS statistics, empty: memory (${env_vars.REDIS_URL})")
    p.add_argument("--namespace", help=f"key namespace in Redis, one per job (${env_vars.KEY_PREFIX})")
    a = p.parse_args(argv)
    job = podenv.Job(environ, max_tokens=a.max_tokens, max_in_flight=a.max_in_flight,
                     max_concurrent_generations=a.max_concurrent_generations)  # fmt: skip

    def build() -> Config:
        tasks = job.config.scheduler.tasks
        if a.system_prompt is not None:
            tasks = [dataclasses.replace(t, system_prompt=a.system_prompt) for t in tasks]
        knobs = {k: v for k in KNOBS if (v := getattr(a, k)) is not None}
        settings = dataclasses.replace(job.config.scheduler.settings, **knobs)
        # The variable names one server (a cluster's headless Service) or several, comma-separated.
        env_urls = a.env_url or [
            u.strip() for u in podenv.pick(None, environ, env_vars.ENV_URL, flag="--env-url").split(",")
        ]
        return Config(
            host=a.host, port=a.port, metrics_port=podenv.metrics_port(environ, a.metrics_port), tasks=tasks,
            settings=settings,
            env_urls=env_urls, env_resolve_interval_s=a.env_resolve_interval_s,
            reward_url=podenv.pick(a.reward_url, environ, env_vars.REWARD_URL, flag="--reward-url"),
            placement=podenv.pick(a.placement, environ, env_vars.PLACEMENT_ADDR, flag="--placement"),
            buffer=podenv.pick(a.buffer, environ, env_vars.BUFFER_ADDR, flag="--buffer"),
            redis=podenv.redis_url(environ, a.redis),
            namespace=a.namespace or environ.get(env_vars.KEY_PREFIX) or "default",
            token=podenv.token(environ),
        )  # fmt: skip

    return podenv.or_exit(build, prog=PROG)


def expand_headless(url: str) -> list[str]:
    """One URL per IPv4 address the host resolves to; empty when it does not resolve.

    The env Service is headless: a session lives in one pod, so every pod needs its own client
    (a single URL would let DNS scatter one session's steps, once the Service has a second pod).
    An ``https`` URL is kept as given: its certificate and SNI name the host, not the pods' IPs, so it
    is one endpoint that keeps sessions itself (a balancer with affinity, not a headless Service).
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https":
        return [url]
    host, port = parts.hostname or "", parts.port
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return []
    addresses = sorted({str(info[4][0]) for info in infos if info[0] == socket.AF_INET})
    return [
        parts._replace(netloc=address if port is None else f"{address}:{port}").geturl()
        for address in addresses
    ]


def resolve_envs(given: Sequence[str]) -> list[str]:
    """Every given env URL resolved into pod URLs; empty when any of them does not resolve now."""
    out: list[str] = []
    for url in given:
        urls = expand_headless(url)
        if not urls:
            return []
        out += urls
    return out


async def refresh_envs(
    svc: service.SchedulerService, pool: env_client.EnvPool, resolve: Callable[[], Sequence[str]],
    *, interval_s: float,
) -> None:  # fmt: skip
    """Resolve the env servers every ``interval_s`` until cancelled; ``resolve`` is the seam (DNS in
    a pod, a list in tests), called in a thread since resolution blocks."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            urls = await asyncio.to_thread(resolve)
        except Exception:
            log.exception("resolving the env servers failed; keeping %d", len(pool.urls))
            continue
        if pool.update(urls):
            svc.set_envs(pool.clients)
            log.info("env servers now %s", pool.urls)
        for url in await pool.reap():
            log.info("env server %s gone and its sessions ended: client closed", url)


async def follow_consumption(
    svc: service.SchedulerService, buffer: buffer_client.BufferClient, *, interval_s: float
) -> None:
    """Tell ``svc`` every ``interval_s`` how many completed trajectories the trainer has taken from the
    buffer (first deliveries, and those evicted as stale, which left it too), until cancelled."""
    while True:
        try:
            stats = await buffer.stats()
        except errors.TreadleError as exc:
            log.info("buffer counters unavailable (%s); the admission window keeps its last count", exc)
        else:
            svc.set_consumed(stats.delivered - stats.redelivered + stats.evicted)
        await asyncio.sleep(interval_s)


class AgentPool:
    """One ``AgentClient`` per worker address, created on first use."""

    def __init__(self, *, token: str | None = None) -> None:
        self.clients: dict[str, agent_client.AgentClient] = {}
        self.token = token

    def __call__(self, address: str) -> agent_client.AgentClient:
        client = self.clients.get(address)
        if client is None:
            client = self.clients[address] = agent_client.AgentClient(address, token=self.token)
        return client

    async def aclose(self) -> None:
        for client in self.clients.values():
            await client.aclose()


async def main(cfg: Config) -> None:
    tasks = {t.name: t for t in cfg.tasks}
    # Not resolvable yet: start with the names; the env client retries through them until it is.
    make_env = functools.partial(env_client.EnvClient, token=cfg.token)
    pool = env_client.EnvPool(resolve_envs(cfg.env_urls) or cfg.env_urls, make=make_env)
    agents = AgentPool(token=cfg.token)
    reward = reward_client.RewardClient(cfg.reward_url, token=cfg.token)
    placement = placement_client.PlacementClient(cfg.placement, token=cfg.token)
    buffer = buffer_client.BufferClient(cfg.buffer, token=cfg.token)
    darts_stats = (
        darts_store.RedisStats.from_url(cfg.redis, namespace=cfg.namespace)
        if cfg.redis
        else darts_store.MemoryStats()
    )  # only DARTS tasks read or write it: other jobs never connect
    work_journal = (
        journal.RedisJournal.from_url(cfg.redis, namespace=cfg.namespace)
        if cfg.redis
        else journal.MemoryJournal()
    )  # without Redis nothing outlives the process (local mode without --redis)
    svc = service.SchedulerService(
        tasks=tasks, settings=cfg.settings, envs=pool.clients, agent_for=agents,
        placement=placement, reward=reward, buffer=buffer, darts_stats=darts_stats, journal_=work_journal,
    )  # fmt: skip
    recovered = await recover(svc)
    if recovered.groups or recovered.version:
        log.info("recovered from the journal: version %d, %d groups (%d trajectories) to run",
                 recovered.version, recovered.groups, recovered.trajectories)  # fmt: skip
    podenv.serve_metrics(svc.registry, cfg.host, cfg.metrics_port)
    served = await grpc_server.build_server(svc, host=cfg.host, port=cfg.port, token=cfg.token)
    runtime.settle_heap()
    logging.info("scheduler serving on %s:%d (env servers %s)", cfg.host, served.port, pool.urls)

    async def close() -> None:
        await svc.aclose()
        await pool.aclose()
        await agents.aclose()
        await reward.aclose()
        await placement.aclose()
        await buffer.aclose()

    reporter = jobreport.JobReporter.from_env(os.environ)
    reporting = (
        asyncio.create_task(report(svc, reporter, interval_s=REPORT_INTERVAL_S), name="job reporter")
        if reporter is not None
        else None
    )

    refreshing = (
        asyncio.create_task(
            refresh_envs(
                svc,
                pool,
                functools.partial(resolve_envs, cfg.env_urls),
                interval_s=cfg.env_resolve_interval_s,
            ),
            name="env servers",
        )
        if cfg.env_resolve_interval_s > 0
        else None
    )

    following = asyncio.create_task(
        follow_consumption(svc, buffer, interval_s=CONSUMED_INTERVAL_S), name="trainer consumption"
    )

    async def stop() -> None:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)
        if refreshing is not None:
            refreshing.cancel()
            await asyncio.gather(refreshing, return_exceptions=True)
        if reporting is not None and reporter is not None:
            reporting.cancel()
            await asyncio.gather(reporting, return_exceptions=True)
            await reporter.aclose()
        await close()

    await grpcutil_server.serve_forever(served, on_stop=stop)


async def recover(svc: service.SchedulerService, *, budget_s: float = 300.0) -> protocol.Recovery:
    """``svc.recover()``, waiting out a Redis that is not up yet (a pod started beside it) for
    ``budget_s``: a scheduler that served before reading its journal would run new work past the old."""
    deadline = asyncio.get_running_loop().time() + budget_s
    delay = 0.5
    while True:
        try:
            return await svc.recover()
        except errors.Unavailable as exc:
            if asyncio.get_running_loop().time() + delay > deadline:
                raise
            log.warning("waiting %.1fs for the journal: %s", delay, exc)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 5.0)


async def report(
    svc: service.SchedulerService, reporter: jobreport.JobReporter, *, interval_s: float
) -> None:
    """Report the reward backlog, the training progress and the rollout until cancelled (each patched
    on change; the rollout at most every ``jobreport.ROLLOUT_INTERVAL_S``)."""
    log.info("reporting on %s/%s every %.1fs", reporter.namespace, reporter.job, interval_s)
    loop = asyncio.get_running_loop()
    while True:
        await reporter.report_demand(svc.reward_backlog())
        await reporter.report_progress(svc.progress)
        await reporter.report_rollout(svc.stats(), max_staleness=svc.tally.max_staleness, now=loop.time())
        await asyncio.sleep(interval_s)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(main(parse_args()))
