"""``spec.trainer``: the trainer that belongs to the job, where it runs, and the reference trainer's knobs.

Referenced by ``RolloutJobSpec.trainer`` in ``treadle.api.v1alpha1`` (so the CRD carries it); turned
into ``jobconfig.TrainerConfig`` by ``treadle.api.jobconfig`` and rendered as a batch/v1 Job by
``treadle.operator.render.trainer``. Unset: the job has no trainer of its own, and a trainer running
elsewhere drives it through the SDK (``treadle.client.connect``) with the job's addresses.

The default workload is Treadle's reference GRPO trainer (``python -m treadle.trainer.job``) in the
trained agent's inference image, which carries torch, transformers and Treadle. The training batch
size and the staleness bound are the job's (``spec.rollout.batchSize`` and ``staleness``): the
rollout side admits and evicts by them, so the trainer never sets its own.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from treadle.api import base

REFERENCE_MODULE = "treadle.trainer.job"
"""The reference trainer's entrypoint (``python -m``), the default ``command``."""
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"

Arg = Annotated[str, Field(max_length=4096)]


class EnvVar(base.Model):
    """A literal environment variable of the trainer's container."""

    name: str = Field(min_length=1, max_length=253, pattern=ENV_NAME)
    """Variable name, once in the list; not ``TREADLE_*`` (Treadle's own, which it sets)."""
    value: str = Field(default="", max_length=32768)
    """Value."""


class Trainer(base.Model):
    """The job's trainer: a batch/v1 Job that runs until its steps are done."""

    agent: base.Name | None = None
    """The agent (``agents[].name``) whose policy is trained; unset: the job's only agent."""
    image: str | None = Field(default=None, min_length=1, max_length=512)
    """Trainer image; unset: the trained agent's inference image (torch, transformers, Treadle)."""
    command: list[Arg] = Field(default_factory=list, max_length=32)
    """Container command; empty: Treadle's reference GRPO trainer (``python -m treadle.trainer.job``)."""
    args: list[Arg] = Field(default_factory=list, max_length=64)
    """Container arguments, after ``command``."""
    env: list[EnvVar] = Field(default_factory=list, max_length=64)
    """Extra environment variables of the trainer's container."""
    accelerator: base.Accelerator | None = None
    """Accelerator class of the trainer's node (``treadle.dev/accelerator=<value>``); unset: any node."""
    gpus: int = Field(default=0, ge=0, le=8)
    """``nvidia.com/gpu`` the trainer asks for; > 0 also tolerates the ``nvidia.com/gpu`` taint. The
    reference trainer computes on CPU (it trains small models); GPUs serve a trainer of your own."""
    node_selector: dict[str, str] = Field(default_factory=dict, max_length=16)
    """Extra node labels the trainer's pod requires, merged over the accelerator selector."""
    tolerations: list[base.Toleration] = Field(default_factory=list, max_length=16)
    """Extra tolerations of the trainer's pod."""
    resources: base.Resources = base.Resources(
        requests=base.ResourceList(cpu="2", memory="8Gi"), limits=base.ResourceList(cpu="2", memory="8Gi")
    )
    """The trainer container's CPU and memory (``gpus`` adds ``nvidia.com/gpu``); unset: 2 CPU and 8Gi,
    requested and limited."""
    steps: int = Field(default=20, ge=1, le=1_000_000)
    """Reference trainer: GRPO steps (one published and committed version each), then the Job ends."""
    learning_rate: float = Field(default=3e-3, gt=0.0, le=1.0)
    """Reference trainer: Adam learning rate."""
    clip_low: float = Field(default=0.2, ge=0.0, le=10.0)
    """Reference trainer: lower clip of the policy ratio, ``1 - clipLow``."""
    clip_high: float = Field(default=0.2, ge=0.0, le=10.0)
    """Reference trainer: upper clip of the policy ratio, ``1 + clipHigh`` (DAPO's clip-higher)."""
    threads: int | None = Field(default=None, ge=1, le=1024)
    """Reference trainer: torch CPU threads; unset: torch's default."""
    batch_timeout_seconds: float = Field(default=600.0, ge=1.0, le=86_400.0)
    """Reference trainer: how long one ``get_batch`` may wait before the trainer fails."""
