"""The trainer's step metrics in TensorBoard, Weights & Biases and MLflow (``spec.trainer.tracking``).

Each tracker runs its real client offline: TensorBoard event files read back by TensorBoard's own
reader, a W&B run in ``offline`` mode read back from its ``.wandb`` file, an MLflow run in a ``file:``
store read back through ``MlflowClient``. No account, no server, no network.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
import re
import struct
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from treadle import errors
from treadle.api import env_vars, jobconfig, v1alpha1
from treadle.api import trainer as trainer_api
from treadle.services import podenv
from treadle.trainer import grpo, loop, tracking

ROOT = pathlib.Path(__file__).resolve().parents[3]
SPEC: dict[str, Any] = {
    "agents": [{"name": "a", "model": "/models/a"}],
    "pools": [{"name": "p", "agent": "a", "accelerator": "H20"}],
    "tasks": [{"name": "t", "agents": ["a"], "environment": "math-tool", "reward": "math"}],
    "rollout": {"batchSize": 16, "staleness": 1},
}
STEPS = (1, 2, 3)


def record(step: int) -> loop.StepRecord:
    """A step whose values differ per step, so a tracker's history shows which step it logged."""
    stats = grpo.LossStats(
        loss=0.5 / step, policy_loss=0.4 / step, kl=0.01 * step, clip_fraction=0.1 * step,
        behaviour_kl=0.03, tokens=64,
    )  # fmt: skip
    return loop.StepRecord(
        step=step, version=step - 1, published=step, batch_id=f"b{step}", samples=8, tokens=64,
        mean_reward=0.25 * step, staleness=1, token_versions=(0, 1), evicted_groups=0, swap_s=0.3,
        train_s=1.5, publish_s=0.2, stats=stats, aborted_on_commit=0, wait_s=2.0, published_bytes=1000,
        entropy=2.5, grad_norm=0.75 * step, trained_tokens=300 * step,
    )  # fmt: skip


def trainer_config(**tracking_spec: Any) -> jobconfig.TrainerConfig:
    spec = v1alpha1.parse_spec({**SPEC, "trainer": {"learningRate": 0.01, "tracking": tracking_spec}})
    job = v1alpha1.RolloutJob(metadata={"name": "j", "namespace": "ns"}, spec=spec)
    cfg = jobconfig.job_config(job, max_tokens=64, max_in_flight=64, max_concurrent_generations=8).trainer
    assert cfg is not None
    return cfg


def run_steps(trackers: tracking.Trackers) -> None:
    try:
        for step in STEPS:
            trackers.log(record(step))
    finally:
        trackers.close()


def test_a_step_becomes_the_scalars_named_as_the_prometheus_gauges() -> None:
    first, second = tracking.scalars(record(1)), tracking.scalars(record(2))
    assert first == {
        "loss": 0.5, "policy_loss": 0.4, "kl": 0.01, "behaviour_kl": 0.03, "clip_fraction": 0.1,
        "mean_reward": 0.25, "staleness": 1.0, "entropy": 2.5, "grad_norm": 0.75, "tokens_per_s": 200.0,
        "samples": 8.0, "tokens": 64.0, "trained_tokens": 300.0, "evicted_groups": 0.0,
        "aborted_on_commit": 0.0, "published_version": 1.0, "published_bytes": 1000.0,
        "batch_wait_s": 2.0, "train_s": 1.5, "publish_s": 0.2,
    }  # fmt: skip
    # As in Prometheus: the first step had no fence before it, so no weight sync.
    assert second["weight_sync_s"] == 0.3 and set(second) - set(first) == {"weight_sync_s"}
    assert tracking.scalars(dataclasses.replace(record(1), train_s=0.0))["tokens_per_s"] == 0.0


def test_the_tracking_field_reaches_the_trainer_through_the_job_file(tmp_path: pathlib.Path) -> None:
    """camelCase in the spec, through the job file the operator mounts, to ``TrainerConfig``."""
    written = {
        "tensorboard": {"logDir": "/logs/tb"},
        "wandb": {"project": "p", "mode": "offline", "entity": "team"},
        "mlflow": {"trackingUri": "http://mlflow:5000", "experiment": "e"},
    }
    spec = v1alpha1.parse_spec({**SPEC, "trainer": {"tracking": written}})
    assert spec.trainer is not None and spec.trainer.tracking == trainer_api.Tracking(
        tensorboard=trainer_api.TensorBoardTracking(log_dir="/logs/tb"),
        wandb=trainer_api.WandbTracking(project="p", mode="offline", entity="team"),
        mlflow=trainer_api.MlflowTracking(tracking_uri="http://mlflow:5000", experiment="e"),
    )
    job = v1alpha1.RolloutJob(metadata={"name": "j", "namespace": "ns"}, spec=spec)
    path = tmp_path / "job.json"
    path.write_text(jobconfig.job_file(job))
    assert json.loads(path.read_text())["trainer"]["tracking"] == written
    cfg = podenv.job_config({env_vars.CONFIG: str(path), env_vars.JOB: "j"}).trainer
    assert cfg is not None and cfg.tracking == spec.trainer.tracking
    # Unset: no tracker, and the job file carries no field for it.
    bare_spec = v1alpha1.parse_spec({**SPEC, "trainer": {}})
    bare = v1alpha1.RolloutJob(metadata={"name": "j", "namespace": "ns"}, spec=bare_spec)
    assert "tracking" not in json.loads(jobconfig.job_file(bare))["trainer"]
    none = jobconfig.trainer_config(bare, [])
    assert none is not None and none.tracking is None and tracking.start(none, run="j").trackers == []


@pytest.mark.parametrize(
    ("written", "field"),
    [
        ({"wandb": {"project": "p", "mode": "sometimes"}}, "spec.trainer.tracking.wandb.mode"),
        ({"wandb": {"mode": "offline"}}, "spec.trainer.tracking.wandb.project"),
        ({"mlflow": {"trackingUri": "http://m"}}, "spec.trainer.tracking.mlflow.experiment"),
        ({"tensorboard": {"logDir": ""}}, "spec.trainer.tracking.tensorboard.logDir"),
        ({"comet": {}}, "spec.trainer.tracking.comet"),
    ],
)
def test_a_bad_tracker_setting_is_refused_naming_its_field(written: dict[str, Any], field: str) -> None:
    with pytest.raises(errors.SpecError) as caught:
        v1alpha1.parse_spec({**SPEC, "trainer": {"tracking": written}})
    assert caught.value.field == field


def test_tensorboard_event_files_hold_each_steps_values(tmp_path: pathlib.Path) -> None:
    from tensorboard.backend.event_processing import event_accumulator  # type: ignore[import-untyped]

    cfg = trainer_config(tensorboard={"logDir": str(tmp_path / "tb")})
    run_steps(tracking.start(cfg, run="j"))

    events = event_accumulator.EventAccumulator(str(tmp_path / "tb" / "j"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == set(tracking.scalars(record(2)))
    for name in ("loss", "mean_reward", "grad_norm", "tokens_per_s", "kl"):
        got = [(e.step, e.value) for e in events.Scalars(name)]
        assert [s for s, _ in got] == list(STEPS)
        assert [v for _, v in got] == pytest.approx([tracking.scalars(record(s))[name] for s in STEPS])
    assert [e.step for e in events.Scalars("weight_sync_s")] == [2, 3]


@pytest.fixture
def wandb_offline(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[pathlib.Path]:
    """W&B's files in tmp_path, quiet and offline; its service process ended afterwards."""
    for name, value in {
        "WANDB_DIR": tmp_path, "WANDB_CONFIG_DIR": tmp_path / "config", "WANDB_CACHE_DIR": tmp_path / "cache",
        "WANDB_DATA_DIR": tmp_path / "data", "WANDB_SILENT": "true", "WANDB_CONSOLE": "off",
        "WANDB_DISABLE_GIT": "true", "WANDB_DISABLE_CODE": "true", "WANDB_MODE": "offline",
    }.items():  # fmt: skip
        monkeypatch.setenv(name, str(value))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    yield tmp_path
    import wandb

    wandb.teardown()


def wandb_records(path: pathlib.Path) -> Iterator[Any]:
    """The records of a ``.wandb`` run file: a 7-byte header, then LevelDB's log format (32 KiB blocks of
    chunks, each a 7-byte header: checksum, length, type FULL 1 / FIRST 2 / MIDDLE 3 / LAST 4) around
    protobuf ``Record`` messages."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    pos, payload = 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _checksum, length, kind = struct.unpack_from("<IHB", data, pos)
        payload += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            message = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
            message.ParseFromString(payload)
            payload = b""
            yield message


def test_a_wandb_offline_run_holds_each_steps_values(wandb_offline: pathlib.Path) -> None:
    cfg = trainer_config(wandb={"project": "treadle-test", "mode": "offline"})
    run_steps(tracking.start(cfg, run="j"))

    (run_file,) = wandb_offline.glob("wandb/offline-run-*/run-*.wandb")
    history: dict[int, dict[str, Any]] = {}
    runs = []
    for message in wandb_records(run_file):
        kind = message.WhichOneof("record_type")
        if kind == "history":
            items = message.history.item
            history[message.history.step.num] = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items
            }
        elif kind == "run":
            runs.append(message.run)
    assert sorted(history) == list(STEPS)
    for step in STEPS:
        want = tracking.scalars(record(step))
        assert {k: v for k, v in history[step].items() if not k.startswith("_")} == pytest.approx(want)
    (run,) = runs
    assert (run.display_name, run.project) == ("j", "treadle-test")
    config = {i.key: json.loads(i.value_json) for i in run.config.update if not i.key.startswith("_")}
    assert config == tracking.params(cfg) and config["learning_rate"] == 0.01


def test_an_mlflow_run_holds_each_steps_values(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    # MLflow 3 keeps its file store only on request (a server is the production case).
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    cfg = trainer_config(mlflow={"trackingUri": uri, "experiment": "treadle-test"})
    run_ids = []
    for _ in range(2):  # the second run finds the experiment the first created
        trackers = tracking.start(cfg, run="j")
        (mlflow_tracker,) = trackers.trackers
        assert isinstance(mlflow_tracker, tracking.Mlflow)
        run_ids.append(mlflow_tracker.run_id)
        run_steps(trackers)

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("treadle-test")
    assert experiment is not None
    for run_id in run_ids:
        run = client.get_run(run_id)
        assert run.info.experiment_id == experiment.experiment_id
        assert (run.info.run_name, run.info.status) == ("j", "FINISHED")
        assert run.data.params == {k: str(v) for k, v in tracking.params(cfg).items()}
        for name in ("loss", "mean_reward", "tokens_per_s"):
            history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, name))
            assert [s for s, _ in history] == list(STEPS)
            assert [v for _, v in history] == pytest.approx(
                [tracking.scalars(record(s))[name] for s in STEPS]
            )
        assert [m.step for m in client.get_metric_history(run_id, "weight_sync_s")] == [2, 3]


@pytest.mark.parametrize(
    ("missing", "field", "package"),
    [
        ("tensorboard", "tensorboard", "tensorboard"),
        ("wandb", "wandb", "wandb"),
        ("mlflow", "mlflow", "mlflow-skinny"),
    ],
)
def test_a_tracker_whose_client_is_missing_fails_at_start_naming_field_and_extra(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, missing: str, field: str, package: str
) -> None:
    monkeypatch.setitem(sys.modules, missing, None)  # `import <missing>` raises ImportError
    monkeypatch.delitem(sys.modules, "torch.utils.tensorboard", raising=False)
    cfg = trainer_config(
        tensorboard={"logDir": str(tmp_path / "tb")},
        wandb={"project": "p", "mode": "offline"},
        mlflow={"trackingUri": (tmp_path / "mlruns").as_uri(), "experiment": "e"},
    )
    with pytest.raises(errors.SpecError) as caught:
        tracking.start(cfg, run="j")
    assert caught.value.field == f"spec.trainer.tracking.{field}"
    assert f"needs the {package} package" in str(caught.value)
    assert "pip install 'treadle[tracking]'" in str(caught.value)
    # Checked before any tracker opened a run.
    assert not (tmp_path / "tb").exists() and not (tmp_path / "mlruns").exists()


class Fake:
    def __init__(self, *, fail: bool = False) -> None:
        self.fail, self.closed = fail, False
        self.steps: list[int] = []

    def log(self, record: loop.StepRecord) -> None:
        if self.fail:
            raise ConnectionError("tracker down")
        self.steps.append(record.step)

    def close(self) -> None:
        self.closed = True
        if self.fail:
            raise ConnectionError("tracker down")


def test_a_failing_tracker_is_logged_and_the_others_still_log_and_close(
    caplog: pytest.LogCaptureFixture,
) -> None:
    down, up = Fake(fail=True), Fake()
    trackers = tracking.Trackers([down, up])
    with caplog.at_level(logging.WARNING, logger=tracking.__name__):
        run_steps(trackers)
    assert up.steps == list(STEPS) and down.closed and up.closed
    assert [r.getMessage() for r in caplog.records] == [
        *(f"Fake failed to log step {s}; training goes on" for s in STEPS), "Fake failed to close",
    ]  # fmt: skip


def test_the_metrics_section_of_the_training_doc_is_a_valid_trainer_spec() -> None:
    section = (ROOT / "docs" / "TRAINING.md").read_text().split("## Metrics", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert block, "docs/TRAINING.md's Metrics section lost its tracking example"
    trainer = yaml.safe_load(block.group(1))["spec"]["trainer"]
    spec = v1alpha1.parse_spec({**SPEC, "trainer": trainer})
    assert spec.trainer is not None and spec.trainer.tracking is not None
    assert spec.trainer.tracking.wandb is not None and spec.trainer.tracking.mlflow is not None
    assert spec.trainer.tracking.tensorboard is not None
