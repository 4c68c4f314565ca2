"""Inference-side apply rules: validated versions load, anything else is refused untouched."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pytest

from treadle import errors
from treadle.weights import layout, loader, objects, publish, pull

PREFIX = "jobs/serve"


def _state(seed: int, *, rows: int = 4) -> dict[str, np.ndarray]:
    return {
        "embed.weight": np.full((rows, 8), seed, dtype=np.float32),
        "norm.weight": np.full((8,), seed, dtype=np.float32),
    }


SPEC = {"embed.weight": ("float32", (4, 8)), "norm.weight": ("float32", (8,))}


class Fatal(Exception):
    pass


class Engine:
    """Records what would be loaded into the model."""

    def __init__(self, fail: bool = False) -> None:
        self.loads: list[dict[str, np.ndarray]] = []
        self.fail = fail

    def load(self, weights: Iterable[tuple[str, Any]]) -> None:
        got = {name: np.array(t) for name, t in weights}
        if self.fail:
            raise RuntimeError("copy into parameter failed")
        self.loads.append(got)


def _fatal(exc: BaseException) -> NoReturn:
    raise Fatal from exc


@pytest.fixture
def store(tmp_path: Path) -> objects.FileStore:
    return objects.FileStore(tmp_path)


def _loader(store: objects.ObjectStore) -> loader.Loader:
    return loader.Loader(pull.Reader(store, PREFIX), SPEC, kind="numpy", on_fatal=_fatal)


def test_prefetch_then_apply_loads_the_version(store: objects.FileStore) -> None:
    publish.Publisher(store, PREFIX).publish(_state(1), 1)
    target, engine = _loader(store), Engine()
    target.prefetch(1)
    status = target.apply(1, engine.load)
    assert status["loaded_version"] == 1 and status["healthy"] and status["last_error"] is None
    assert list(engine.loads[0]) == ["embed.weight", "norm.weight"]
    np.testing.assert_array_equal(engine.loads[0]["norm.weight"], _state(1)["norm.weight"])


def test_apply_without_prefetch_pulls_now_and_reuses_the_buffer(store: objects.FileStore) -> None:
    pub = publish.Publisher(store, PREFIX)
    pub.publish(_state(1), 1)
    target, engine = _loader(store), Engine()
    target.apply(1, engine.load)
    pub.publish(_state(2), 2)
    target.prefetch(2)
    target.apply(2, engine.load)
    np.testing.assert_array_equal(engine.loads[1]["embed.weight"], _state(2)["embed.weight"])
    np.testing.assert_array_equal(engine.loads[0]["embed.weight"], _state(1)["embed.weight"])  # copies


def test_corrupt_version_is_refused_and_the_previous_keeps_serving(store: objects.FileStore) -> None:
    pub = publish.Publisher(store, PREFIX)
    pub.publish(_state(1), 1)
    manifest = pub.publish(_state(2), 2)
    target, engine = _loader(store), Engine()
    target.apply(1, engine.load)
    path = store.root / manifest.buckets[0].key
    data = bytearray(path.read_bytes())
    data[0] ^= 1
    path.write_bytes(bytes(data))
    target.prefetch(2)
    with pytest.raises(layout.CorruptVersion):
        target.apply(2, engine.load)
    status = target.status()
    assert status["loaded_version"] == 1 and status["healthy"] and "v2 refused" in status["last_error"]
    assert len(engine.loads) == 1


def test_unpublished_version_is_refused(store: objects.FileStore) -> None:
    target, engine = _loader(store), Engine()
    target.prefetch(3)
    with pytest.raises(errors.NotFound):
        target.apply(3, engine.load)
    assert engine.loads == [] and target.loaded_version == 0


@pytest.mark.parametrize(
    "state,match",
    [
        ({"embed.weight": np.zeros((4, 8), np.float32)}, "lacks 1"),
        (_state(1, rows=5), "shape"),
    ],
    ids=["missing_tensor", "wrong_shape"],
)
def test_version_not_matching_the_served_checkpoint_is_refused(
    store: objects.FileStore, state: dict[str, np.ndarray], match: str
) -> None:
    publish.Publisher(store, PREFIX).publish(state, 1)
    target, engine = _loader(store), Engine()
    with pytest.raises(errors.Conflict, match=match):
        target.apply(1, engine.load)
    assert engine.loads == [] and target.loaded_version == 0


def test_extra_published_tensors_are_not_loaded(store: objects.FileStore) -> None:
    publish.Publisher(store, PREFIX).publish({**_state(1), "lm_head.weight": np.zeros((4, 8), np.float32)}, 1)
    target, engine = _loader(store), Engine()
    target.apply(1, engine.load)
    assert list(engine.loads[0]) == ["embed.weight", "norm.weight"]


def test_failed_load_marks_unhealthy_and_is_fatal(store: objects.FileStore) -> None:
    pub = publish.Publisher(store, PREFIX)
    pub.publish(_state(1), 1)
    pub.publish(_state(2), 2)
    target = _loader(store)
    with pytest.raises(Fatal):
        target.apply(1, Engine(fail=True).load)
    assert target.status()["healthy"] is False
    with pytest.raises(errors.Unavailable, match="restarted"):
        target.apply(2, Engine().load)


def test_versions_only_go_forward(store: objects.FileStore) -> None:
    pub = publish.Publisher(store, PREFIX)
    pub.publish(_state(1), 1)
    pub.publish(_state(2), 2)
    target, engine = _loader(store), Engine()
    target.prefetch(1)
    target.prefetch(2)  # supersedes the prefetch of 1
    target.apply(2, engine.load)
    for v in (1, 2):
        with pytest.raises(errors.Conflict):
            target.prefetch(v)
        with pytest.raises(errors.Conflict):
            target.apply(v, engine.load)
    assert target.status()["prefetching"] == [] and len(engine.loads) == 1


def _write_safetensors(path: Path, header: dict[str, Any]) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


def test_checkpoint_spec_reads_safetensors_headers(tmp_path: Path) -> None:
    _write_safetensors(
        tmp_path / "model-00001.safetensors",
        {"__metadata__": {"format": "pt"}, "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}},
    )
    _write_safetensors(
        tmp_path / "model-00002.safetensors", {"b": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}
    )
    assert loader.checkpoint_spec(tmp_path) == {"a": ("float32", (2, 3)), "b": ("bfloat16", (4,))}
    with pytest.raises(errors.NotFound):
        loader.checkpoint_spec(tmp_path / "nothing")


def test_store_from_env(tmp_path: Path) -> None:
    store, prefix = loader.store_from_env(
        {"TREADLE_WEIGHTS_PREFIX": "p", "TREADLE_WEIGHTS_DIR": str(tmp_path)}
    )
    assert isinstance(store, objects.FileStore) and prefix == "p"
    for env, field in [
        ({}, "TREADLE_WEIGHTS_PREFIX"),
        ({"TREADLE_WEIGHTS_PREFIX": "p"}, "TREADLE_WEIGHTS_MASTER"),
    ]:
        with pytest.raises(errors.SpecError) as exc:
            loader.store_from_env(env)
        assert exc.value.field == field


def test_model_dir_is_a_folder_or_the_hub_cache_snapshot_vllm_downloaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert loader.model_dir(str(tmp_path)) == tmp_path
    # The Hugging Face cache layout: refs/<revision> names the snapshot folder.
    cache = tmp_path / "hub"
    repo = cache / "models--acme--tiny"
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    assert loader.model_dir("acme/tiny") == snapshot
    with pytest.raises(errors.NotFound, match="acme/other"):
        loader.model_dir("acme/other")
