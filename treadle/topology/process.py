"""What one process of a job is (``Process``), where the job runs (``Site``), and the fixed parts:
each component's module and port."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Literal

from treadle.api import base

# Ports every per-job component listens on in a cluster (its pod's container port; Services expose the
# same numbers). Local mode picks free ports of its own instead.
PORTS: Mapping[str, int] = {
    "scheduler": 50051,
    "placement": 50052,
    "buffer": 50053,
    "weights": 50054,
    "env": 8000,
    "reward": 8001,
    "agent": 8002,
    "feeder": 8003,
    "vllm": 8080,
    # Every Treadle process of a job serves /metrics here, apart from its API (gRPC cannot answer a
    # scrape): the containers' port named "metrics", scraped by pod annotations or a PodMonitor.
    "metrics": 9090,
}
# Python modules each component runs as ``python -m <module> --host H --port N``.
MODULES: Mapping[str, str] = {
    "scheduler": "treadle.services.scheduler",
    "placement": "treadle.services.placement",
    "buffer": "treadle.services.buffer",
    "env": "treadle.services.env",
    "reward": "treadle.services.reward",
    "agent": "treadle.services.agent",
    "feeder": "treadle.services.feeder",
    "weights": "treadle.weights.store",
}
VLLM_MODULE = "vllm.entrypoints.openai.api_server"
# The vLLM worker extension (weight pull under suspend) shipped in the inference image, and the flags
# that load it with Treadle's weight-transfer engine.
VLLM_WORKER_EXTENSION = base.VLLM_WORKER_EXTENSION
VLLM_WEIGHTS_ARGS = base.VLLM_WEIGHTS_ARGS

COMPONENT_ADDRESSES = ("scheduler", "placement", "buffer", "env", "reward")
"""The components every process of a job is told how to reach (``Site.addresses``)."""


@dataclasses.dataclass(frozen=True)
class Site:
    """Where a job runs, as far as its processes' arguments and environment depend on it."""

    addresses: Mapping[str, str]
    """How the other processes reach each of ``COMPONENT_ADDRESSES``: ``host:port`` of the gRPC ones
    (scheduler, placement, buffer), a base URL of the HTTP ones (env, reward). ``env`` may list
    several servers' URLs, comma-separated (local mode's; a cluster's headless Service is one name)."""
    config_path: str
    """The job file (``treadle.api.jobconfig.job_file``) as every process reads it."""
    key_prefix: str
    """Where the job keeps its state in the shared stores (Redis keys, weight versions)."""


@dataclasses.dataclass(frozen=True)
class Process:
    """One process of a job: what runs, with which arguments and environment, how many of it."""

    component: str
    """``scheduler``, ``placement``, ``buffer``, ``weights``, ``env``, ``reward``, ``feeder``,
    ``vllm`` or ``agent`` (the last two once per inference pool)."""
    module: str
    """Run as ``python -m <module>``."""
    port: int
    """Its port in a cluster (``PORTS``); an executor binds it with ``--host H --port N`` of its own."""
    protocol: Literal["grpc", "http"]
    replicas: int
    """As the job asks (in a cluster); local mode runs its own count of some (env servers, workers)."""
    args: tuple[str, ...] = ()
    """Arguments after ``--host H --port N``."""
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """The job-level variables (``treadle.api.env_vars``): the job, its file, its key prefix, the
    other components' addresses and the process's identity (pool, agent)."""
    pool: str | None = None
    """The inference pool of a ``vllm`` or ``agent`` process."""
    metrics: bool = True
    """Whether it serves Treadle's ``/metrics`` (the Mooncake store and vLLM do not)."""

    @property
    def name(self) -> str:
        """``component``, or ``component-pool`` for a pool's processes."""
        return self.component if self.pool is None else f"{self.component}-{self.pool}"
