"""Names of the ``TREADLE_*`` variables in the pods the operator renders: the one list of them.

``treadle.operator.render`` writes them; each service's ``__main__`` (through
``treadle.services.podenv``), the weight loader inside vLLM (``treadle.weights.loader``) and the
Mooncake store process (``treadle.weights.store``) read them. Both sides name them from here, so a
rename cannot leave a pod with a variable nobody reads.
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
REWARD_URL = "TREADLE_REWARD_URL"

# Coordination services.
SCHEDULING_POLICY = "TREADLE_SCHEDULING_POLICY"
PLACEMENT_POLICY = "TREADLE_PLACEMENT_POLICY"
STALENESS = "TREADLE_STALENESS"
BATCH_SIZE = "TREADLE_BATCH_SIZE"

# The inference agent beside vLLM.
ENGINE_URL = "TREADLE_ENGINE_URL"
POOL = "TREADLE_POOL"
AGENT = "TREADLE_AGENT"
AGENT_STATE = "TREADLE_AGENT_STATE"
ACCELERATOR = "TREADLE_ACCELERATOR"

# The environment pool.
ENVIRONMENTS = "TREADLE_ENVIRONMENTS"
WARM_POOL = "TREADLE_WARM_POOL"
CPU_PER_ACTION = "TREADLE_CPU_PER_ACTION"

# The reward gateway.
REWARD_TYPE = "TREADLE_REWARD_TYPE"
REWARD_EXTERNAL_URL = "TREADLE_REWARD_EXTERNAL_URL"
REWARD_JUDGE_MODEL = "TREADLE_REWARD_JUDGE_MODEL"

# The vLLM container's weight loader (``treadle.weights.vllm_extension``).
WEIGHTS_PREFIX = "TREADLE_WEIGHTS_PREFIX"
WEIGHTS_AGENT = "TREADLE_WEIGHTS_AGENT"
WEIGHTS_DIR = "TREADLE_WEIGHTS_DIR"
WEIGHTS_MASTER = "TREADLE_WEIGHTS_MASTER"
WEIGHTS_METADATA = "TREADLE_WEIGHTS_METADATA"
WEIGHTS_REPLICAS = "TREADLE_WEIGHTS_REPLICAS"
WEIGHTS_INITIAL_VERSION = "TREADLE_WEIGHTS_INITIAL_VERSION"
