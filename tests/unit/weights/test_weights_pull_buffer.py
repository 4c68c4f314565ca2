"""The pull buffer: made by the reader's allocator (pinned for CUDA engines), reused across versions."""

from __future__ import annotations

import importlib
import json
import logging
import struct
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pytest

from treadle import errors
from treadle.weights import layout, loader, objects, publish, pull, receive, vllm_extension

PREFIX = "jobs/serve"
SPEC = {"embed.weight": ("float32", (4, 8)), "norm.weight": ("float32", (8,))}


def _state(seed: int, *, extra_rows: int = 0) -> dict[str, np.ndarray]:
    state = {
        "embed.weight": np.full((4, 8), seed, dtype=np.float32),
        "norm.weight": np.full((8,), seed, dtype=np.float32),
    }
    if extra_rows:  # a tensor the served checkpoint lacks: a larger version that still loads
        state["lm_head.weight"] = np.full((extra_rows, 8), seed, dtype=np.float32)
    return state


class Fatal(Exception):
    pass


def _fatal(exc: BaseException) -> NoReturn:
    raise Fatal from exc


class Allocator:
    """Records every buffer it hands out (pageable, as on a machine without CUDA)."""

    def __init__(self) -> None:
        self.buffers: list[objects.Bytes] = []

    def __call__(self, nbytes: int) -> objects.Bytes:
        self.buffers.append(pull.pageable(nbytes))
        return self.buffers[-1]


class Engine:
    """Copies what it loads and notes which allocation the tensors it was given live in."""

    def __init__(self, allocator: Allocator) -> None:
        self.allocator = allocator
        self.loads: list[dict[str, np.ndarray]] = []
        self.sources: list[int] = []

    def load(self, weights: Iterable[tuple[str, Any]]) -> None:
        pairs = list(weights)
        first = pairs[0][1]
        self.sources.append(
            next(i for i, b in enumerate(self.allocator.buffers) if np.shares_memory(first, b))
        )
        self.loads.append({name: np.array(t) for name, t in pairs})


@pytest.fixture
def store(tmp_path: Path) -> objects.FileStore:
    return objects.FileStore(tmp_path)


def _loader(store: objects.ObjectStore, allocate: pull.Allocate) -> loader.Loader:
    return loader.Loader(pull.Reader(store, PREFIX, allocate=allocate), SPEC, kind="numpy", on_fatal=_fatal)


def test_the_allocators_buffer_is_pulled_into_and_reused_across_versions(store: objects.FileStore) -> None:
    pub, alloc = publish.Publisher(store, PREFIX), Allocator()
    target = _loader(store, alloc)
    engine = Engine(alloc)
    for version in (1, 2, 3):
        pub.publish(_state(version), version)
        target.prefetch(version)
        target.apply(version, engine.load)
    # Applied without a prefetch too: the same buffer.
    pub.publish(_state(4), 4)
    target.apply(4, engine.load)
    assert len(alloc.buffers) == 1 and engine.sources == [0, 0, 0, 0]
    for version, loaded in enumerate(engine.loads, start=1):
        np.testing.assert_array_equal(loaded["embed.weight"], _state(version)["embed.weight"])


def test_a_larger_version_gets_a_fresh_buffer_which_is_kept_whole(store: objects.FileStore) -> None:
    pub, alloc = publish.Publisher(store, PREFIX, staleness_window=8), Allocator()
    target = _loader(store, alloc)
    engine = Engine(alloc)
    pub.publish(_state(1), 1)
    pub.publish(_state(2, extra_rows=64), 2)
    pub.publish(_state(3), 3)
    pub.publish(_state(4, extra_rows=64), 4)
    small = pull.Reader(store, PREFIX).manifest(1).layout_bytes
    large = pull.Reader(store, PREFIX).manifest(2).layout_bytes
    assert large > small
    for version in (1, 2, 3, 4):
        target.prefetch(version)
        target.apply(version, engine.load)
    # v2 outgrew v1's buffer; v3 (smaller) and v4 (as large again) reuse all of v2's.
    assert [b.nbytes for b in alloc.buffers] == [small, large]
    assert engine.sources == [0, 1, 1, 1]
    np.testing.assert_array_equal(engine.loads[3]["norm.weight"], _state(4)["norm.weight"])


def test_a_refused_pull_keeps_the_buffer(store: objects.FileStore) -> None:
    pub, alloc = publish.Publisher(store, PREFIX, staleness_window=8), Allocator()
    target = _loader(store, alloc)
    engine = Engine(alloc)
    pub.publish(_state(1), 1)
    target.apply(1, engine.load)
    pub.publish({"embed.weight": np.zeros((4, 8), np.float32)}, 2)  # lacks norm.weight
    with pytest.raises(errors.Conflict):
        target.apply(2, engine.load)
    with pytest.raises(errors.NotFound):
        target.apply(3, engine.load)
    pub.publish(_state(3), 3)
    target.apply(3, engine.load)
    assert len(alloc.buffers) == 1 and engine.sources == [0, 0]


def test_a_move_pulls_with_the_same_allocator(store: objects.FileStore) -> None:
    alloc = Allocator()
    other = layout.agent_prefix("jobs", "other")
    publish.Publisher(store, PREFIX).publish(_state(1), 1)
    publish.Publisher(store, other).publish(_state(7), 3)
    target = _loader(store, alloc)
    engine = Engine(alloc)
    target.apply(1, engine.load)
    target.apply(3, engine.load, prefix=other)
    assert target.reader.prefix == other and target.reader.allocate is alloc
    assert len(alloc.buffers) == 1 and engine.sources == [0, 0]


def test_pull_spare_is_reused_if_large_enough_out_must_be(store: objects.FileStore) -> None:
    pub = publish.Publisher(store, PREFIX)
    need = pub.publish(_state(1), 1).layout_bytes
    alloc = Allocator()
    reader = pull.Reader(store, PREFIX, allocate=alloc)
    big = np.zeros(need + 100, dtype=np.uint8)
    snap = reader.pull(1, spare=big)
    assert snap.storage is big and np.shares_memory(snap.buffer, big) and snap.buffer.nbytes == need
    assert alloc.buffers == []
    snap = reader.pull(1, spare=big[:10])
    assert snap.storage is alloc.buffers[0] and alloc.buffers[0].nbytes == need
    np.testing.assert_array_equal(snap.tensors["norm.weight"], _state(1)["norm.weight"])
    with pytest.raises(errors.SpecError) as exc:
        reader.pull(1, out=big[:10])
    assert exc.value.field == "out"
    with pytest.raises(errors.SpecError) as exc:
        reader.pull(1, out=big, spare=big)
    assert exc.value.field == "spare"
    with pytest.raises(errors.SpecError) as exc:
        reader.pull(1, spare=np.zeros(need, dtype=np.float32))
    assert exc.value.field == "spare"
    assert reader.prefetch(1, spare=big).result(timeout=30).storage is big
    reader.close()


def test_pageable_is_the_default_and_touched() -> None:
    assert pull.Reader(objects.FileStore("/nonexistent-unused"), PREFIX).allocate is pull.pageable
    buf = pull.pageable(1000)
    assert buf.dtype == np.uint8 and buf.shape == (1000,) and buf.flags.owndata and not buf.any()


def test_pinned_falls_back_to_pageable_without_cuda_or_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    buf = pull.pinned(4096)
    assert isinstance(buf, np.ndarray) and buf.flags.owndata and buf.base is None
    assert buf.dtype == np.uint8 and buf.shape == (4096,) and not buf.any()

    def no_torch(name: str) -> Any:
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(importlib, "import_module", no_torch)
    buf = pull.pinned(10)
    assert buf.flags.owndata and buf.shape == (10,)


def _fake_cuda_torch(calls: list[dict[str, Any]], *, fail: bool = False) -> types.SimpleNamespace:
    """torch as pull.pinned sees it on a CUDA machine; the tensor itself is a CPU one (no GPU here)."""
    torch = pytest.importorskip("torch")  # before import_module is patched

    def empty(n: int, *, dtype: Any, pin_memory: bool) -> Any:
        calls.append({"n": n, "dtype": dtype, "pin_memory": pin_memory})
        if fail:
            raise RuntimeError("CUDA error: out of memory")
        return torch.empty(n, dtype=dtype)

    return types.SimpleNamespace(
        uint8=torch.uint8, empty=empty, cuda=types.SimpleNamespace(is_available=lambda: True)
    )


def test_pinned_is_a_numpy_view_of_a_pinned_torch_tensor_that_it_keeps_alive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch = pytest.importorskip("torch")
    calls: list[dict[str, Any]] = []
    fake = _fake_cuda_torch(calls)
    monkeypatch.setattr(importlib, "import_module", lambda name: fake)
    buf = pull.pinned(1 << 20)
    assert calls == [{"n": 1 << 20, "dtype": torch.uint8, "pin_memory": True}]
    assert buf.dtype == np.uint8 and buf.shape == (1 << 20,) and buf.flags.writeable
    # The view holds the tensor (numpy's base), so the memory lives as long as any slice of it.
    front = buf[:100]
    assert isinstance(buf.base, torch.Tensor) and buf.base.data_ptr() == front.ctypes.data
    del buf
    front[:] = 7
    assert int(front.sum()) == 700


def test_pinned_failing_to_pin_logs_and_falls_back(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[dict[str, Any]] = []
    fake = _fake_cuda_torch(calls, fail=True)
    monkeypatch.setattr(importlib, "import_module", lambda name: fake)
    with caplog.at_level(logging.WARNING, logger=pull.__name__):
        buf = pull.pinned(64)
    assert buf.flags.owndata and buf.shape == (64,) and len(calls) == 1
    assert "pageable" in caplog.text


def test_a_pinned_buffer_is_pulled_into_and_registered(store: objects.FileStore) -> None:
    """What a CUDA engine's reader does, with torch's buffer (a CPU one here) and store registration."""
    pytest.importorskip("torch")
    calls: list[dict[str, Any]] = []
    registered: list[tuple[int, int]] = []

    class Recording(objects.FileStore):
        def register(self, buf: objects.Bytes) -> None:
            registered.append((buf.ctypes.data, buf.nbytes))  # what Mooncake's register_buffer gets

    recording = Recording(store.root)
    publish.Publisher(recording, PREFIX).publish(_state(1), 1)
    registered.clear()
    fake = _fake_cuda_torch(calls)

    def allocate(nbytes: int) -> objects.Bytes:
        tensor = fake.empty(nbytes, dtype=fake.uint8, pin_memory=True)
        out: objects.Bytes = tensor.numpy()
        return out

    snap = pull.Reader(recording, PREFIX, allocate=allocate).pull(1, kind="torch")
    assert snap.storage is not None and len(calls) == 1 and calls[0]["pin_memory"]
    assert registered == [(snap.storage.ctypes.data, snap.manifest.layout_bytes)]
    assert float(snap.tensors["norm.weight"][0]) == 1.0


def test_the_vllm_extension_pins_only_on_a_cuda_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    (model / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    monkeypatch.setenv("TREADLE_WEIGHTS_PREFIX", PREFIX)
    monkeypatch.setenv("TREADLE_WEIGHTS_DIR", str(tmp_path / "store"))
    for cuda, expected in ((False, pull.pageable), (True, pull.pinned)):
        monkeypatch.setattr(receive, "cuda", lambda cuda=cuda: cuda)
        ext = vllm_extension.WeightsExtension()
        ext.vllm_config = types.SimpleNamespace(
            model_config=types.SimpleNamespace(model=str(model), revision=None)
        )
        target = ext._treadle_loader()
        assert target.reader.allocate is expected
        target.close()
