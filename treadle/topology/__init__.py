"""A job's topology: the processes it runs, as a pure function of its configuration.

``processes(job, site)`` lists every process of a job (module, arguments, environment, port,
replicas) in start order. Everything that runs a job goes through it: the operator's renderers
(``treadle.operator.render``) turn each ``Process`` into a container, and local mode
(``treadle.localmode.run``) starts each as a process on 127.0.0.1. A service added to a job is added
here once.

What differs between the two is where the job runs (``Site``: how each component is reached, where
the job file is, the job's key prefix), an input here, and what each executor adds in one named
place of its own: ``treadle.operator.render.common.deployment_env`` (mounted secrets, the shared
Redis and Mooncake, the metrics port, the cluster's namespace) and
``treadle.localmode.launches.deployment`` and ``run_env`` (its own counts and ports, the run's token
and Redis).
``tests/unit/dataplane/test_topology.py`` holds the two to the same module, arguments and
environment per component.
"""

from treadle.topology.job import job_env, processes, reward_replicas
from treadle.topology.process import (
    COMPONENT_ADDRESSES,
    MODULES,
    PORTS,
    VLLM_MODULE,
    VLLM_WORKER_EXTENSION,
    Process,
    Site,
)

__all__ = [
    "COMPONENT_ADDRESSES",
    "MODULES",
    "PORTS",
    "VLLM_MODULE",
    "VLLM_WORKER_EXTENSION",
    "Process",
    "Site",
    "job_env",
    "processes",
    "reward_replicas",
]
