"""Names of the ``TREADLE_*`` variables in the pods the operator renders: the one list of them.

``treadle.operator.render`` writes them; each service's ``__main__`` (through
``treadle.services.podenv``), the weight loader inside vLLM (``treadle.weights.loader``) and the
Mooncake store process (``treadle.weights.store``) read them. Both sides name them from here, so a
rename cannot leave a pod with a variable nobody reads.

No variable repeats a field of the job's spec: every job setting reaches a service once, through
the job file (``CONFIG``) and ``treadle.api.jobconfig``. A variable says only what the spec does
not: where things are (addresses, paths, key prefixes) and which pod this is (its pool, its agent).
``RENDERED`` lists them, and the operator's tests hold every rendered pod to it.
"""

from __future__ import annotations

# Every Treadle container of a job.
JOB = "TREADLE_JOB"
NAMESPACE = "TREADLE_NAMESPACE"
CONFIG = "TREADLE_CONFIG"
"""The validated job spec (``job.json`` in the job's ConfigMap)."""
ENDPOINTS = "TREADLE_ENDPOINTS"
"""Every component's in-cluster address (``endpoints.json``), for people and user code."""
KEY_PREFIX = "TREADLE_KEY_PREFIX"
REDIS_URL = "TREADLE_REDIS_URL"
MOONCAKE_MASTER = "TREADLE_MOONCAKE_MASTER"
MOONCAKE_METADATA_URL = "TREADLE_MOONCAKE_METADATA_URL"
SCHEDULER_ADDR = "TREADLE_SCHEDULER_ADDR"
PLACEMENT_ADDR = "TREADLE_PLACEMENT_ADDR"
BUFFER_ADDR = "TREADLE_BUFFER_ADDR"
ENV_URL = "TREADLE_ENV_URL"
"""The environment servers' base URL (a cluster's headless Service), or several, comma-separated
(local mode's servers, each on a port of its own)."""
REWARD_URL = "TREADLE_REWARD_URL"
METRICS_PORT = "TREADLE_METRICS_PORT"
"""Where the container's Treadle process serves Prometheus ``/metrics`` (the pod's ``metrics`` port;
unset or 0: it serves none, as outside a cluster unless a flag asks)."""
TOKEN_FILE = "TREADLE_TOKEN_FILE"
"""The job's bearer token (``token`` of the job's Secret, mounted): servers require it, clients send it."""
TOKEN = "TREADLE_TOKEN"
"""The token itself, for a trainer outside the job (never rendered: pods get ``TOKEN_FILE``)."""
REDIS_PASSWORD_FILE = "TREADLE_REDIS_PASSWORD_FILE"
"""The job's Redis password (``redis-password`` of the job's Secret); its Redis user is the key prefix."""

# The inference agent beside vLLM.
ENGINE_URL = "TREADLE_ENGINE_URL"
POOL = "TREADLE_POOL"
AGENT = "TREADLE_AGENT"
AGENT_STATE = "TREADLE_AGENT_STATE"

# The vLLM container's weight loader (``treadle.weights.vllm_extension``).
WEIGHTS_PREFIX = "TREADLE_WEIGHTS_PREFIX"
WEIGHTS_AGENT = "TREADLE_WEIGHTS_AGENT"
WEIGHTS_DIR = "TREADLE_WEIGHTS_DIR"
WEIGHTS_MASTER = "TREADLE_WEIGHTS_MASTER"
WEIGHTS_METADATA = "TREADLE_WEIGHTS_METADATA"
WEIGHTS_REPLICAS = "TREADLE_WEIGHTS_REPLICAS"
WEIGHTS_INITIAL_VERSION = "TREADLE_WEIGHTS_INITIAL_VERSION"

RENDERED = frozenset(
    {
        JOB, NAMESPACE, CONFIG, ENDPOINTS, KEY_PREFIX, REDIS_URL, MOONCAKE_MASTER, MOONCAKE_METADATA_URL,
        SCHEDULER_ADDR, PLACEMENT_ADDR, BUFFER_ADDR, ENV_URL, REWARD_URL, METRICS_PORT, TOKEN_FILE,
        REDIS_PASSWORD_FILE,
        ENGINE_URL, POOL, AGENT, AGENT_STATE,
        WEIGHTS_PREFIX, WEIGHTS_AGENT, WEIGHTS_DIR, WEIGHTS_MASTER, WEIGHTS_METADATA,
    }
)  # fmt: skip
"""The ``TREADLE_*`` variables a rendered pod may carry: addresses, paths and the pod's identity
(``IDENTITY``), none a spec field."""
IDENTITY = frozenset({JOB, NAMESPACE, POOL, AGENT, WEIGHTS_AGENT})
"""Which job this pod belongs to and which pool and agent it serves: names (the pool's and agent's
from the spec) that differ from pod to pod, no setting."""

# torchrun's own settings in a trainer group's pods (``spec.trainer`` with more than one process):
# ``torch.distributed.run`` reads ``PET_<FLAG>`` for each of its flags, so the reference trainer and a
# ``torchrun`` command of the user's own take the group's topology from the pod without a flag. Not
# Treadle's (no ``TREADLE_`` prefix, not in ``RENDERED``): names of torch's and of gloo's.
TORCHRUN_NNODES = "PET_NNODES"
"""Pods of the group (``--nnodes``): ``spec.trainer.replicas``."""
TORCHRUN_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
"""Ranks per pod (``--nproc-per-node``): ``spec.trainer.processesPerPod``, else ``gpus``."""
TORCHRUN_NODE_RANK = "PET_NODE_RANK"
"""The pod's place in the group (``--node-rank``): its Indexed Job completion index."""
TORCHRUN_MASTER_ADDR = "PET_MASTER_ADDR"
"""Where rank 0 listens (``--master-addr``): the group's rendezvous Service, which resolves to pod 0."""
TORCHRUN_MASTER_PORT = "PET_MASTER_PORT"
"""Rank 0's rendezvous port (``--master-port``)."""
GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"
"""The interface gloo binds to (else whatever the pod's hostname resolves to): the pod's ``eth0``."""
TORCHRUN = (
    TORCHRUN_NNODES, TORCHRUN_NPROC_PER_NODE, TORCHRUN_NODE_RANK, TORCHRUN_MASTER_ADDR, TORCHRUN_MASTER_PORT,
    GLOO_SOCKET_IFNAME,
)  # fmt: skip
"""Every variable a trainer group's pods get for ``torchrun`` (and only they)."""
