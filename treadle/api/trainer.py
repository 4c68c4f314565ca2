"""``spec.trainer``: the trainer that belongs to the job, where it runs, and the reference trainer's knobs.

Referenced by ``RolloutJobSpec.trainer`` in ``treadle.api.v1alpha1`` (so the CRD carries it); turned
into ``jobconfig.TrainerConfig`` by ``treadle.api.jobconfig`` and rendered as a batch/v1 Job by
``treadle.operator.render.trainer``. Unset: the job has no trainer of its own, and a trainer running
elsewhere drives it through the SDK (``treadle.client.connect``) with the job's addresses.

The default workload is Treadle's reference GRPO trainer (``python -m treadle.trainer.job``) in the
trained agent's inference image, which carries torch, transformers and Treadle. The training batch
size and the staleness bound are the job's (``spec.rollout.batchSize`` and ``staleness``): the
rollout side admits and evicts by them, so the trainer never sets its own.

The trainer is a group of ``replicas`` pods of ``processesPerPod`` ranks each (``world_size`` ranks in
all): one process renders as today, more run under ``torchrun``, whose topology the operator renders
as the environment ``torchrun`` reads (``treadle.api.env_vars.TORCHRUN``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from treadle.api import base

REFERENCE_MODULE = "treadle.trainer.job"
"""The reference trainer's entrypoint (``python -m``), the default ``command``."""
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
MAX_REPLICAS = 64
"""Most pods of one trainer group."""
MAX_PROCESSES_PER_POD = 64
"""Most ranks in one trainer pod."""

PROCESSES_PER_POD_MESSAGE = (
    "spec.trainer.processesPerPod must equal spec.trainer.gpus when gpus > 0 (one rank per GPU); "
    "leave it unset to follow gpus"
)

Arg = Annotated[str, Field(max_length=4096)]


class EnvVar(base.Model):
    """A literal environment variable of the trainer's container."""

    name: str = Field(min_length=1, max_length=253, pattern=ENV_NAME)
    """Variable name, once in the list; not ``TREADLE_*`` (Treadle's own, which it sets)."""
    value: str = Field(default="", max_length=32768)
    """Value."""


class TensorBoardTracking(base.Model):
    """TensorBoard event files (``torch.utils.tensorboard.SummaryWriter``)."""

    log_dir: str = Field(min_length=1, max_length=1024)
    """Folder the job's run goes in, as ``<logDir>/<job name>`` (point ``tensorboard --logdir`` at
    ``logDir``; a restarted trainer adds to the same run). A path in the trainer's container (lost with
    the pod unless the image mounts storage there) or a URL TensorBoard's file layer writes: ``s3://``
    with ``boto3`` installed, or any fsspec protocol with ``fsspec`` and its driver; their credentials
    through ``env``."""


class WandbTracking(base.Model):
    """A Weights & Biases run (``wandb.init``), named after the job."""

    project: str = Field(min_length=1, max_length=128)
    """W&B project."""
    entity: str | None = Field(default=None, min_length=1, max_length=128)
    """W&B team or user; unset: the API key's default entity."""
    mode: Literal["online", "offline"] = "online"
    """``online`` sends as it trains and needs ``WANDB_API_KEY`` in ``env`` (``WANDB_BASE_URL`` too for
    a server of your own); ``offline`` writes the run under ``WANDB_DIR`` (``env``; else the working
    folder) in the container, for ``wandb sync`` later."""


class MlflowTracking(base.Model):
    """An MLflow run (``MlflowClient``), named after the job."""

    tracking_uri: str = Field(min_length=1, max_length=1024)
    """The tracking server (``http(s)://...``, ``databricks``) or store. A token goes in ``env`` as
    ``MLFLOW_TRACKING_TOKEN`` (or ``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD``)."""
    experiment: str = Field(min_length=1, max_length=256)
    """Experiment name, created if the server has none of that name."""


class Tracking(base.Model):
    """Experiment trackers the reference trainer logs each step's metrics to (rank 0), besides its
    Prometheus metrics: any of the three, at once. They need the image to carry the tracker's client
    (``pip install 'treadle[tracking]'``); a configured one whose client is missing fails the trainer at
    start. Secrets (``WANDB_API_KEY``, ``MLFLOW_TRACKING_TOKEN``) come from ``spec.trainer.env``."""

    tensorboard: TensorBoardTracking | None = None
    """TensorBoard event files; unset: none."""
    wandb: WandbTracking | None = None
    """A Weights & Biases run; unset: none."""
    mlflow: MlflowTracking | None = None
    """An MLflow run; unset: none."""


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
    """``nvidia.com/gpu`` each trainer pod asks for; > 0 also tolerates the ``nvidia.com/gpu`` taint.
    With GPUs the reference trainer computes on them with FSDP2, one rank per GPU
    (``processesPerPod`` = ``gpus``); without, on CPU."""
    replicas: int = Field(default=1, ge=1, le=MAX_REPLICAS)
    """Pods of the trainer group (an Indexed batch/v1 Job, one completion index per pod). More than one
    process in all runs the reference trainer under ``torchrun``; a command of your own gets the same
    topology in ``torchrun``'s environment (``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``,
    ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``)."""
    processes_per_pod: int | None = Field(default=None, ge=1, le=MAX_PROCESSES_PER_POD)
    """Ranks per trainer pod (``torchrun --nproc-per-node``); unset: ``gpus`` when ``gpus`` > 0, else 1.
    With ``gpus`` > 0 it must equal ``gpus``: one rank per GPU."""
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
    micro_batch_tokens: int | None = Field(default=None, ge=1, le=100_000_000)
    """Reference trainer: most prompt + output tokens one rank puts through the model at once; a larger
    share of the batch is split into micro-batches whose gradients add up (the step is unchanged).
    Unset: each rank's share in one pass."""
    activation_checkpointing: bool = False
    """Reference trainer: recompute each decoder layer in the backward pass instead of keeping its
    activations (less memory, about a third more compute)."""
    max_grad_norm: float | None = Field(default=None, gt=0.0, le=1_000_000.0)
    """Reference trainer: clip the gradients' global norm to this; unset: measured, not clipped."""
    tracking: Tracking | None = None
    """Reference trainer: experiment trackers (TensorBoard, Weights & Biases, MLflow) rank 0 logs each
    step's metrics to, besides Prometheus; unset: none. The image needs their clients (the pip extra
    ``treadle[tracking]``), else the trainer fails at start; their secrets (``WANDB_API_KEY``,
    ``MLFLOW_TRACKING_TOKEN``) go in ``env``."""

    @field_validator("processes_per_pod")
    @classmethod
    def _one_rank_per_gpu(cls, value: int | None, info: ValidationInfo) -> int | None:
        gpus = info.data.get("gpus", 0)
        if value is not None and gpus and value != gpus:
            raise PydanticCustomError(
                "processes_per_pod",
                PROCESSES_PER_POD_MESSAGE + " (processesPerPod {value}, gpus {gpus})",
                {"value": value, "gpus": gpus},
            )
        return value

    @property
    def processes(self) -> int:
        """Ranks per pod: ``processesPerPod``, else ``gpus`` (one rank per GPU), else 1."""
        return self.processes_per_pod or self.gpus or 1

    @property
    def world_size(self) -> int:
        """Ranks of the whole group: ``replicas`` pods of ``processes`` ranks."""
        return self.replicas * self.processes

    @property
    def distributed(self) -> bool:
        """More than one process in all: the group runs under ``torchrun``."""
        return self.world_size > 1


class TrainerStatus(base.Model):
    """Observed state of the job's trainer group (``status.trainer``), written by the operator from the
    pods of the trainer's current Job."""

    job: str = Field(max_length=63)
    """The trainer's batch/v1 Job (``<job>-trainer-<hash>``): ``kubectl logs job/<name>``."""
    pods: int = Field(ge=0)
    """Pods the group runs (``spec.trainer.replicas``; 0 while suspended)."""
    ready: int = Field(ge=0)
    """Pods running and ready."""
    succeeded: int = Field(default=0, ge=0)
    """Pods that finished their steps (exit 0)."""
    restarts: int = Field(default=0, ge=0)
    """Trainer container restarts plus failed pods (each replaced by the Job), over the current Job's
    pods. One rank's death restarts every pod's container, so a group restart counts about ``pods``;
    a pod deleted by hand is not counted."""
