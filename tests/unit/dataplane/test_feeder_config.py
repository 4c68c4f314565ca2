"""The feeder's start: configuration from the pod (``TREADLE_*``, job.json), datasets read once with
errors naming ``spec.tasks[i].dataset``, and group ids the scheduler accepts at their longest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from treadle import errors
from treadle.api import dataset as dataset_api
from treadle.api import env_vars, jobconfig, v1alpha1
from treadle.data import rows
from treadle.services.feeder import __main__ as feeder_main
from treadle.services.feeder import service
from treadle.services.scheduler import protocol as scheduler_protocol
from treadle.v1 import scheduler_pb2

ROOT = Path(__file__).resolve().parents[3]


def _spec(dataset: dict[str, Any] | None, *, data: Path = ROOT, **task: Any) -> dict[str, Any]:
    """A job whose second task reads ``dataset``; its path sources lie under ``data``."""
    return {
        "feeder": {"volumes": [{"name": "data", "mountPath": str(data), "hostPath": {"path": str(data)}}]},
        "agents": [{"name": "a", "model": "m"}],
        "pools": [{"name": "p", "agent": "a", "accelerator": "H20"}],
        "tasks": [
            {"name": "seeds", "agents": ["a"], "environment": "math-tool", "reward": "math"},
            {"name": "rows", "agents": ["a"], "environment": "math-tool", "reward": "math",
             "dataset": dataset, **task},
        ],
        "rollout": {"batchSize": 48},
    }  # fmt: skip


def _environ(tmp_path: Path, spec: dict[str, Any]) -> dict[str, str]:
    config = tmp_path / "job.json"
    config.write_text(json.dumps(spec))
    return {
        env_vars.CONFIG: str(config), env_vars.JOB: "job1", env_vars.REDIS_URL: "redis://127.0.0.1:1",
        env_vars.SCHEDULER_ADDR: "127.0.0.1:2",
    }  # fmt: skip


EXAMPLE = {"source": {"path": str(ROOT / "manifests/dev/data/math.jsonl")}, "promptColumn": "question",
           "answerColumn": "answer", "idColumn": "id"}  # fmt: skip


def test_config_comes_from_the_pod_and_flags_override(tmp_path: Path) -> None:
    environ = _environ(tmp_path, _spec(EXAMPLE))
    cfg = feeder_main.parse_args([], environ)
    assert (cfg.redis_url, cfg.scheduler, cfg.namespace) == ("redis://127.0.0.1:1", "127.0.0.1:2", "job1")
    assert cfg.feeder.target_pending == 48  # the job's batch size
    over = feeder_main.parse_args(
        ["--target-pending", "4", "--namespace", "ns", "--scheduler", "h:1"], environ
    )
    assert (over.feeder.target_pending, over.namespace, over.scheduler) == (4, "ns", "h:1")
    prefixed = feeder_main.parse_args([], {**environ, env_vars.KEY_PREFIX: "default/job1"})
    assert prefixed.namespace == "default/job1"


def test_a_missing_variable_exits_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    environ = _environ(tmp_path, _spec(EXAMPLE))
    del environ[env_vars.SCHEDULER_ADDR]
    with pytest.raises(SystemExit) as exit_info:
        feeder_main.parse_args([], environ)
    assert exit_info.value.code == 2
    assert env_vars.SCHEDULER_ADDR in capsys.readouterr().err


def test_an_unusable_dataset_exits_2_naming_its_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = {**EXAMPLE, "answerColumn": "solution"}
    with pytest.raises(SystemExit) as exit_info:
        feeder_main.main([], _environ(tmp_path, _spec(bad)))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "spec.tasks[1].dataset.answerColumn: no column 'solution'" in err, err


def test_every_task_is_fed_with_its_members_and_weights_a_seed_task_its_seeds() -> None:
    spec = v1alpha1.parse_spec(_spec(EXAMPLE, groupSize=4, redundancy=0.5, weight=2.0))
    datasets = service.read_datasets(jobconfig.feeder_config(spec), mount=dataset_api.CONFIG_MAP_MOUNT)
    assert [(d.task.index, len(d.rows)) for d in datasets] == [(0, 0), (1, 64)]
    unconnected = aioredis.Redis.from_url("redis://127.0.0.1:1")  # builds no connection until used
    seeds, feed = service.feeds(datasets, client=unconnected, namespace="ns")
    first = seeds.groups(seeds.position, 3)
    assert [(g.group_id, g.seed, g.options_json) for g in first] == [
        (f"{seeds.task}:s{i}", i, "") for i in range(3)
    ]
    assert seeds.store.key == f"treadle:feed:{{ns}}:{seeds.task}:seeds"
    assert not seeds.shuffle.done(seeds.position)  # as long as the job runs
    assert (feed.task, feed.members, feed.weight) == ("rows", 6, 2.0)
    assert feed.store.key.startswith("treadle:feed:{ns}:rows:")
    (group,) = feed.groups(feed.position, 1)
    row = feed.rows[group.seed]
    assert group.group_id == f"rows:e0:{row.row_id}" and group.task == "rows"
    assert json.loads(group.options_json) == {"row": row.option()}


def test_a_row_too_large_for_the_scheduler_names_the_dataset(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    path.write_text(json.dumps({"prompt": "x" * (scheduler_protocol.MAX_OPTIONS_BYTES + 1)}) + "\n")
    spec = v1alpha1.parse_spec(_spec({"source": {"path": str(path)}}, data=tmp_path))
    with pytest.raises(errors.SpecError, match="row '0' takes") as info:
        service.read_datasets(jobconfig.feeder_config(spec), mount=dataset_api.CONFIG_MAP_MOUNT)
    assert info.value.field == "spec.tasks[1].dataset"


def test_the_longest_group_id_is_one_the_scheduler_takes() -> None:
    task = "t" * 63
    longest = service.group_id(task, dataset_api.MAX_EPOCHS, "r" * 80)
    assert rows.ROW_ID.match("r" * 80) and not rows.ROW_ID.match("r" * 81)
    tasks = {task: jobconfig.TaskConfig(name=task, env="math-tool")}
    (work,) = scheduler_protocol.validate_groups(
        [scheduler_pb2.PromptGroup(group_id=longest, task=task)], tasks
    )
    assert work.group_id == longest
