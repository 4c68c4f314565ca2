"""The worker's receive side (``treadle.weights.receive``), shared by Treadle's vLLM weight-transfer
engine and the worker extension: a refused version names its version and what failed, and nothing
is loaded. Without vLLM (the success path re-packs vLLM's embeddings and is run by the slow tier)."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from treadle.weights import layout, objects, publish, receive, vllm_extension

PREFIX = "unit/recv"


@pytest.fixture
def store_and_receiver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[objects.FileStore, receive.Receiver]:
    model = tmp_path / "model"
    model.mkdir()
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    (model / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\x00" * 16)
    env = {"TREADLE_WEIGHTS_PREFIX": PREFIX, "TREADLE_WEIGHTS_DIR": str(tmp_path / "store")}
    monkeypatch.setattr(receive, "cuda", lambda: False)
    return objects.FileStore(tmp_path / "store"), receive.Receiver(str(model), None, env)


def _never(weights: Iterator[tuple[str, Any]]) -> None:
    raise AssertionError("a refused version must not be loaded")


def test_a_corrupt_bucket_is_refused_naming_version_and_bucket(
    store_and_receiver: tuple[objects.FileStore, receive.Receiver],
) -> None:
    store, receiver = store_and_receiver
    manifest = publish.Publisher(store, PREFIX).publish({"w": np.ones(4, dtype=np.float32)}, 1)
    bucket = store.root / manifest.buckets[0].key
    data = bytearray(bucket.read_bytes())
    data[0] ^= 0x40
    bucket.write_bytes(bytes(data))
    with pytest.raises(receive.Refused) as refused:
        receiver.apply(1, "", _never, model=None)
    message = str(refused.value)
    assert f"{PREFIX} v1 refused" in message and manifest.buckets[0].key in message and "digest" in message
    assert receiver.loader.status()["loaded_version"] == 0


def test_a_missing_or_malformed_version_is_refused(
    store_and_receiver: tuple[objects.FileStore, receive.Receiver],
) -> None:
    store, receiver = store_and_receiver
    store.put(layout.bucket_key(PREFIX, 2, 0), b"\x00" * 64)  # buckets without a manifest: uncommitted
    with pytest.raises(receive.Refused, match=f"{PREFIX} v2 refused: version 2 is not committed"):
        receiver.apply("2", "", _never, model=None)
    with pytest.raises(receive.Refused, match="version 'seven' is not an integer"):
        receiver.apply("seven", "", _never, model=None)
    with pytest.raises(receive.Refused, match=f"{PREFIX}/planner v1 refused"):
        receiver.apply(1, "planner", _never, model=None)  # a move to an agent with no versions
    assert receiver.loader.status()["loaded_version"] == 0


def test_the_extension_shares_the_weight_transfer_engines_receiver(
    store_and_receiver: tuple[objects.FileStore, receive.Receiver],
) -> None:
    _, receiver = store_and_receiver

    class Engine:
        def treadle_receiver(self) -> receive.Receiver:
            return receiver

    ext = vllm_extension.WeightsExtension()
    ext.weight_transfer_engine = Engine()  # type: ignore[attr-defined]
    assert ext._treadle_loader() is receiver.loader
    assert ext.treadle_weights_status()["prefix"] == PREFIX
