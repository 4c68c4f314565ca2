"""The reference trainer's step metrics in the user's experiment tracker (``spec.trainer.tracking``).

Rank 0 of ``treadle.trainer.job`` logs each ``loop.StepRecord`` to every configured tracker, beside its
Prometheus sample (``treadle.trainer.exporter``): TensorBoard event files, a Weights & Biases run, an
MLflow run, each through the tracker's own client. All three log the same scalars (``scalars``), named
as the Prometheus gauges are, at the job's step; W&B and MLflow also get the run's settings
(``params``).

The clients are imported only when configured, so the trainer runs without them; a configured one whose
client is missing fails the trainer at start (``errors.SpecError`` naming the field and the extra
``treadle[tracking]``). Once training runs, a tracker that fails to log a step is logged and skipped:
Prometheus still has the step, and a tracker's outage does not stop training.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any, Protocol

from treadle import errors
from treadle.api import jobconfig
from treadle.api import trainer as trainer_api
from treadle.trainer import loop

EXTRA = "treadle[tracking]"
"""The pip extra that installs every tracker's client."""
FIELD = "spec.trainer.tracking"
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow-skinny"}
"""The package each tracker of ``spec.trainer.tracking`` needs (``mlflow`` serves as well)."""
log = logging.getLogger(__name__)

Param = str | int | float | bool


class Tracker(Protocol):
    def log(self, record: loop.StepRecord) -> None:
        """Log the step's ``scalars`` at ``record.step``."""

    def close(self) -> None:
        """Flush and end the run."""


def scalars(r: loop.StepRecord) -> dict[str, float]:
    """The step as flat scalars, named as the Prometheus gauges (``exporter.StepMetrics``); seconds per
    phase as ``<phase>_s``, ``weight_sync_s`` from the second step on (the first has no fence)."""
    values: dict[str, float] = {
        "loss": r.stats.loss,
        "policy_loss": r.stats.policy_loss,
        "kl": r.stats.kl,
        "behaviour_kl": r.stats.behaviour_kl,
        "clip_fraction": r.stats.clip_fraction,
        "mean_reward": r.mean_reward,
        "staleness": r.staleness,
        "entropy": r.entropy,
        "grad_norm": r.grad_norm,
        "tokens_per_s": r.trained_tokens / r.train_s if r.train_s > 0 else 0.0,
        "samples": r.samples,
        "tokens": r.tokens,
        "trained_tokens": r.trained_tokens,
        "evicted_groups": r.evicted_groups,
        "aborted_on_commit": r.aborted_on_commit,
        "published_version": r.published,
        "published_bytes": r.published_bytes,
        "batch_wait_s": r.wait_s,
        "train_s": r.train_s,
        "publish_s": r.publish_s,
    }
    if r.step > 1:
        values["weight_sync_s"] = r.swap_s
    return {name: float(value) for name, value in values.items()}


def params(cfg: jobconfig.TrainerConfig) -> dict[str, Param]:
    """The run's settings, as W&B's config and MLflow's params (unset ones left out)."""
    values: dict[str, Param | None] = {
        "agent": cfg.agent, "model": cfg.model, "steps": cfg.steps, "batch_size": cfg.batch_size,
        "staleness": cfg.alpha, "learning_rate": cfg.lr, "clip_low": cfg.clip_low, "clip_high": cfg.clip_high,
        "temperature": cfg.temperature, "micro_batch_tokens": cfg.micro_batch_tokens,
        "max_grad_norm": cfg.max_grad_norm, "activation_checkpointing": cfg.activation_checkpointing,
        "bf16": cfg.bf16,
    }  # fmt: skip
    return {name: value for name, value in values.items() if value is not None}


def require(module: str, field: str) -> ModuleType:
    """``module``, or a ``SpecError`` naming ``spec.trainer.tracking.<field>``, its package and the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise errors.SpecError(
            f"needs the {PACKAGES[field]} package, which the trainer's image lacks ({exc}): "
            f"pip install '{EXTRA}'",
            field=f"{FIELD}.{field}",
        ) from exc


class TensorBoard:
    """Event files under ``<logDir>/<run>`` (``torch.utils.tensorboard.SummaryWriter``), flushed each step."""

    def __init__(self, spec: trainer_api.TensorBoardTracking, *, run: str) -> None:
        require("tensorboard", "tensorboard")
        summary = require("torch.utils.tensorboard", "tensorboard")
        self.log_dir = f"{spec.log_dir.rstrip('/')}/{run}"
        self.writer: Any = summary.SummaryWriter(log_dir=self.log_dir)

    def log(self, record: loop.StepRecord) -> None:
        for name, value in scalars(record).items():
            self.writer.add_scalar(name, value, global_step=record.step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class Wandb:
    """A W&B run named ``run`` (``wandb.init``), the settings as its config."""

    def __init__(self, spec: trainer_api.WandbTracking, *, run: str, config: Mapping[str, Param]) -> None:
        wandb = require("wandb", "wandb")
        self.run: Any = wandb.init(
            project=spec.project, entity=spec.entity, mode=spec.mode, name=run, config=dict(config)
        )

    def log(self, record: loop.StepRecord) -> None:
        self.run.log(scalars(record), step=record.step)

    def close(self) -> None:
        self.run.finish()


class Mlflow:
    """An MLflow run named ``run`` in ``experiment`` (created if missing), the settings as its params."""

    def __init__(self, spec: trainer_api.MlflowTracking, *, run: str, config: Mapping[str, Param]) -> None:
        require("mlflow", "mlflow")
        client_mod = require("mlflow.tracking", "mlflow")
        self.entities = require("mlflow.entities", "mlflow")
        self.client: Any = client_mod.MlflowClient(tracking_uri=spec.tracking_uri)
        experiment = self._experiment(spec.experiment)
        self.run_id: str = self.client.create_run(experiment, run_name=run).info.run_id
        self.client.log_batch(
            self.run_id, params=[self.entities.Param(name, str(value)) for name, value in config.items()]
        )

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        try:
            return str(self.client.create_experiment(name))
        except Exception:
            # Another job created it in between.
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return str(found.experiment_id)

    def log(self, record: loop.StepRecord) -> None:
        now_ms = int(time.time() * 1000)
        metrics = [
            self.entities.Metric(name, value, now_ms, record.step) for name, value in scalars(record).items()
        ]
        self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class Trackers:
    """Every configured tracker as one ``Tracker``: a step goes to each, a failing one is logged and
    skipped, and each is closed even if another fails to."""

    def __init__(self, trackers: Sequence[Tracker] = ()) -> None:
        self.trackers = list(trackers)

    def log(self, record: loop.StepRecord) -> None:
        for tracker in self.trackers:
            try:
                tracker.log(record)
            except Exception:
                log.warning(
                    "%s failed to log step %d; training goes on", type(tracker).__name__, record.step,
                    exc_info=True,
                )  # fmt: skip

    def close(self) -> None:
        for tracker in self.trackers:
            try:
                tracker.close()
            except Exception:
                log.warning("%s failed to close", type(tracker).__name__, exc_info=True)


def start(cfg: jobconfig.TrainerConfig, *, run: str) -> Trackers:
    """The trackers ``cfg.tracking`` configures, each with a run named ``run`` (the job's name). Every
    configured client is imported before any run is opened, so a missing one fails before the others
    have made a run."""
    spec = cfg.tracking
    if spec is None:
        return Trackers()
    for field, module in (("tensorboard", "tensorboard"), ("wandb", "wandb"), ("mlflow", "mlflow")):
        if getattr(spec, field) is not None:
            require(module, field)
    opened = Trackers()
    try:
        if spec.tensorboard is not None:
            opened.trackers.append(TensorBoard(spec.tensorboard, run=run))
        if spec.wandb is not None:
            opened.trackers.append(Wandb(spec.wandb, run=run, config=params(cfg)))
        if spec.mlflow is not None:
            opened.trackers.append(Mlflow(spec.mlflow, run=run, config=params(cfg)))
    except BaseException:
        opened.close()
        raise
    log.info("logging each step to %s", ", ".join(type(t).__name__ for t in opened.trackers))
    return opened
