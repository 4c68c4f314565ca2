"""Per-agent weight locations: a moved engine loads the receiver's versions and follows them after."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pytest

from treadle import errors
from treadle.weights import layout, loader, objects, publish, pull

JOB = "ns/job"
SPEC = {"w": ("float32", (4,))}
CHECKPOINT = {"w": np.full((4,), -1.0, dtype=np.float32)}


class Fatal(Exception):
    pass


def _fatal(exc: BaseException) -> NoReturn:
    raise Fatal from exc


class Engine:
    def __init__(self) -> None:
        self.loads: list[float] = []

    def load(self, weights: Iterable[tuple[str, Any]]) -> None:
        self.loads.append(float(dict(weights)["w"][0]))


def publish_as(store: objects.ObjectStore, agent: str, version: int, value: float) -> None:
    pub = publish.Publisher(store, layout.agent_prefix(JOB, agent), bucket_bytes=1024, staleness_window=4)
    pub.publish({"w": np.full((4,), value, dtype=np.float32)}, version)


@pytest.fixture
def store(tmp_path: Path) -> objects.FileStore:
    s = objects.FileStore(tmp_path)
    publish_as(s, "executor", 5, 5.0)
    publish_as(s, "planner", 2, 2.0)
    return s


def executor_loader(store: objects.ObjectStore) -> loader.Loader:
    return loader.Loader(
        pull.Reader(store, layout.agent_prefix(JOB, "executor")), SPEC, kind="numpy", on_fatal=_fatal,
        checkpoint=lambda: CHECKPOINT.items(),
    )  # fmt: skip


def test_agent_prefix_is_one_segment_under_the_jobs() -> None:
    assert layout.agent_prefix(JOB, "planner") == "ns/job/planner"
    for bad in ("", "a/b", "-x"):
        with pytest.raises(errors.SpecError) as exc:
            layout.agent_prefix(JOB, bad)
        assert exc.value.field in ("agent", "prefix")


def test_a_move_loads_the_receivers_older_version_and_follows_its_prefix(store: objects.FileStore) -> None:
    engine, target = Engine(), executor_loader(store)
    target.apply(5, engine.load)
    assert engine.loads == [5.0]
    # The planner is at version 2: older than the executor's 5, loaded all the same.
    status = target.apply(2, engine.load, prefix=layout.agent_prefix(JOB, "planner"))
    assert engine.loads == [5.0, 2.0]
    assert (status["prefix"], status["loaded_version"]) == ("ns/job/planner", 2)
    # From now on the planner's versions: its v3 goes forward, the executor's v6 is not read.
    publish_as(store, "executor", 6, 6.0)
    with pytest.raises(errors.NotFound):
        target.apply(6, engine.load)
    publish_as(store, "planner", 3, 3.0)
    target.prefetch(3)
    target.apply(3, engine.load)
    assert engine.loads == [5.0, 2.0, 3.0]


def test_a_move_to_an_untrained_agent_reloads_the_checkpoint(store: objects.FileStore) -> None:
    engine, target = Engine(), executor_loader(store)
    # Both still serve the checkpoint: nothing to load, only the prefix followed changes.
    target.apply(0, engine.load, prefix=layout.agent_prefix(JOB, "critic"))
    assert engine.loads == [] and target.status()["prefix"] == "ns/job/critic"
    target.apply(5, engine.load, prefix=layout.agent_prefix(JOB, "executor"))
    target.apply(0, engine.load, prefix=layout.agent_prefix(JOB, "critic"))
    assert engine.loads == [5.0, -1.0]


def test_a_refused_move_keeps_the_donors_weights_and_prefix(store: objects.FileStore) -> None:
    engine, target = Engine(), executor_loader(store)
    target.apply(5, engine.load)
    with pytest.raises(errors.NotFound):
        target.apply(4, engine.load, prefix=layout.agent_prefix(JOB, "planner"))
    status = target.status()
    assert (status["prefix"], status["loaded_version"], engine.loads) == ("ns/job/executor", 5, [5.0])
    assert "ns/job/planner v4 refused" in status["last_error"]
    # Without a checkpoint reader, version 0 of another agent cannot be served.
    bare = loader.Loader(pull.Reader(store, layout.agent_prefix(JOB, "executor")), SPEC, kind="numpy")
    bare.apply(5, engine.load)
    with pytest.raises(errors.Conflict):
        bare.apply(0, engine.load, prefix=layout.agent_prefix(JOB, "planner"))


def test_store_from_env_reads_the_agents_prefix(tmp_path: Path) -> None:
    env = {"TREADLE_WEIGHTS_DIR": str(tmp_path), "TREADLE_WEIGHTS_PREFIX": JOB}
    assert loader.store_from_env(env)[1] == JOB
    assert loader.store_from_env({**env, "TREADLE_WEIGHTS_AGENT": "planner"})[1] == "ns/job/planner"
