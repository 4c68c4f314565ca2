"""Operator-wide settings that are not part of any RolloutJob: images, ports, shared backends.

Built once by ``treadle operator run`` from the environment the chart sets (``TREADLE_*``) and
handed to the pure renderers, so a rendered child is a function of (job, config) only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

# Each component's port and module are the job topology's (``treadle.topology``), named here too for
# the operator's renderers and tests.
from treadle.topology import MODULES as MODULES
from treadle.topology import PORTS as PORTS
from treadle.topology import VLLM_MODULE as VLLM_MODULE
from treadle.topology import VLLM_WORKER_EXTENSION as VLLM_WORKER_EXTENSION


@dataclass(frozen=True)
class OperatorConfig:
    """What the operator knows beyond the job: images and the shared Redis / Mooncake master."""

    services_image: str = "ghcr.io/treadle-dev/treadle-services:0.1.0"
    """Image of the coordination services (scheduler, placement, buffer, reward, agent sidecar)."""
    redis_url: str = "redis://treadle-redis.treadle-system.svc:6379/0"
    """Shared Redis (experience store); each job uses its own key prefix."""
    mooncake_master: str = "treadle-mooncake.treadle-system.svc:50051"
    """Shared Mooncake master address for weight publication."""
    mooncake_metadata_url: str = "http://treadle-mooncake.treadle-system.svc:8080/metadata"
    """Mooncake HTTP metadata server."""
    image_pull_policy: str = "IfNotPresent"
    """Pull policy for every container the operator renders."""
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    """Labels added to every child (e.g. a team or cost-centre label)."""
    auth_key: str = ""
    """The operator's key: each job's token and Redis password are derived from it and the job's uid
    (``treadle.auth.job_secret``); the chart keeps it in a Secret of its own. ``treadle operator run``
    refuses to start without one."""
    redis_password: str = ""
    """The shared Redis's admin password (the chart's Secret): with it, each job gets a Redis user of
    its own (``redisacl``) and its pods log in as it; without it (a Redis without ACLs) they do not."""
    metrics_namespaces: tuple[str, ...] = ()
    """Namespaces whose pods (Prometheus) may reach a job's HTTP ports for ``/metrics``, besides the
    job's own pods (the job's NetworkPolicy)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        """Read ``TREADLE_SERVICES_IMAGE``, ``TREADLE_REDIS_URL``, ``TREADLE_MOONCAKE_*``,
        ``TREADLE_AUTH_KEY``, ``TREADLE_REDIS_PASSWORD``, ``TREADLE_METRICS_NAMESPACES`` (comma-separated)
        (else defaults)."""
        env = os.environ if env is None else env
        default = cls()
        return cls(
            services_image=env.get("TREADLE_SERVICES_IMAGE", default.services_image),
            redis_url=env.get("TREADLE_REDIS_URL", default.redis_url),
            mooncake_master=env.get("TREADLE_MOONCAKE_MASTER", default.mooncake_master),
            mooncake_metadata_url=env.get("TREADLE_MOONCAKE_METADATA_URL", default.mooncake_metadata_url),
            image_pull_policy=env.get("TREADLE_IMAGE_PULL_POLICY", default.image_pull_policy),
            auth_key=env.get("TREADLE_AUTH_KEY", default.auth_key),
            redis_password=env.get("TREADLE_REDIS_PASSWORD", default.redis_password),
            metrics_namespaces=tuple(
                n.strip() for n in env.get("TREADLE_METRICS_NAMESPACES", "").split(",") if n.strip()
            ),
        )
