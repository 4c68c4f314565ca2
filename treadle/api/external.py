"""``spec.externalResources``: what ARL-Tangram grants per action (API quotas, reward-model GPUs,
CPU cores), in a module of its own beside ``v1alpha1`` (which re-exports every model here)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from treadle.api import base
from treadle.api import engine as engine_api

JUDGE = "judge:"
"""Prefix of a reward that a reward model of ``spec.externalResources.rewardModels`` grades."""


class ApiQuota(base.Model):
    """A rate limit on one external tool, granted per action (ARL-Tangram)."""

    tool: base.Name
    """Tool name as the environment reports it."""
    requests_per_minute: int = Field(ge=1, le=1_000_000)
    """Sustained calls per minute across the job."""
    max_concurrent: int = Field(default=16, ge=1, le=100_000)
    """Calls in flight at once across the job."""


RewardModelEngine = Literal["simulated", "vllm"]
GPU_SIZES = (1, 2, 4, 8)


class RewardModel(base.Model):
    """A reward (judge) model the reward gateway serves on its own GPUs, one action per GPU at a time
    (ARL-Tangram §5.3): each degree of parallelism is a variant, restored from host memory on demand
    onto an aligned chunk of the gateway's ``rewardModelGpus``, least recently used evicted first."""

    name: base.Name
    """Tasks name it as their reward: ``judge:<name>``."""
    model: str = Field(min_length=1, max_length=512)
    """What the engine serves (a model path or Hugging Face name)."""
    weights_gb: float = Field(gt=0.0, le=4096.0)
    """Size of the model's weights (GB): its host-memory backup, sharded over a variant's GPUs."""
    parallelism: list[int] = Field(default=[1], min_length=1, max_length=4)
    """Degrees of parallelism (GPUs per variant) the scheduler may grant: a subset of 1, 2, 4, 8."""
    engine: RewardModelEngine = "simulated"
    """``vllm``: real vLLM, one engine per variant and chunk, started in the gateway's container (its
    image then is ``rewardModelImage``); a restore reloads the weights from the gateway's copy of the
    checkpoint in host memory, on GPUs after waking the engine from sleep level 2. ``simulated``:
    Treadle's simulated engine (its restore copies the real bytes of a ``weightsGb`` host-memory
    backup and is timed; its verdicts are simulated text). Every model of a job uses one engine."""
    engine_args: list[Annotated[str, Field(max_length=4096)]] = Field(default_factory=list, max_length=64)
    """Extra arguments of each vLLM engine of this model (``engine: vllm``), after Treadle's own (a
    repeated flag takes the last value), e.g. ``--max-model-len``."""
    engine_env: list[engine_api.EnvVar] = Field(default_factory=list, max_length=64)
    """Extra environment variables of each vLLM engine of this model (``engine: vllm``), beside the
    gateway's own (``VLLM_SERVER_DEV_MODE`` and, on GPUs, ``CUDA_VISIBLE_DEVICES`` keep Treadle's)."""


class ExternalResources(base.Model):
    """Resources granted per action rather than per trajectory (ARL-Tangram)."""

    api_quotas: list[ApiQuota] = Field(default_factory=list, max_length=32)
    """Per-tool API quotas."""
    reward_model_gpus: int = Field(default=0, ge=0, le=64)
    """GPUs of each reward gateway replica that serve reward models (``rewardModels``, or the judge of
    an ``llm-judge`` reward)."""
    reward_model_gpu_memory_gb: float = Field(default=80.0, gt=0.0, le=4096.0)
    """Memory of one of those GPUs (GB): how many variants stay resident at once."""
    reward_models: list[RewardModel] = Field(default_factory=list, max_length=16)
    """Reward models the gateway serves on ``rewardModelGpus``."""
    reward_model_image: str = Field(default=base.DEFAULT_VLLM_IMAGE, min_length=1, max_length=512)
    """The reward gateway's image when its models' engine is ``vllm``: it starts vLLM in its own
    container, so the image holds vLLM and Treadle (the inference image does)."""
    cpu_cores_per_action: base.Quantity = "1"
    """CPU cores an environment action (tool call, code run) may use: each sandboxed run is pinned to
    this many of the env pod's CPUs, rounded up (``500m`` is 1 CPU) and at most the pod's, with
    OMP/MKL/OpenBLAS thread counts set to match."""
