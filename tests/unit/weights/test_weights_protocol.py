"""The publication protocol on the local FileStore: commit point, validation, gc, crash leftovers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from treadle import errors
from treadle.weights import layout, objects, publish, pull

PREFIX = "jobs/demo"


def _state(seed: int, n: int = 6) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"layer{i}.weight": rng.standard_normal((16, 8 + i)).astype(np.float32) for i in range(n)}


@pytest.fixture
def store(tmp_path: Path) -> objects.FileStore:
    return objects.FileStore(tmp_path / "weights")


def _publisher(store: objects.ObjectStore, **kw: object) -> publish.Publisher:
    return publish.Publisher(store, PREFIX, bucket_bytes=1024, clock=lambda: 100.0, **kw)  # type: ignore[arg-type]


def _assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert list(got) == list(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_round_trip_over_several_buckets(store: objects.FileStore) -> None:
    state = _state(1)
    manifest = _publisher(store).publish(state, 1)
    assert len(manifest.buckets) == 6  # 16x8 float32 = 512 B and up; two never share a 1 KiB bucket
    snap = pull.Reader(store, PREFIX).pull(1)
    assert snap.version == 1 and snap.manifest == manifest
    _assert_same(snap.tensors, state)


def test_nothing_is_visible_before_the_manifest(store: objects.FileStore) -> None:
    reader = pull.Reader(store, PREFIX)
    pub = _publisher(store)
    pub.publish(_state(1), 1)
    seen = []

    def check(index: int, count: int) -> None:
        seen.append(index)
        assert reader.latest() == 1
        with pytest.raises(errors.NotFound):
            reader.pull(2)

    _publisher(store, on_bucket=check).publish(_state(2), 2)
    assert seen == list(range(6))
    assert reader.latest() == 2
    _assert_same(reader.pull(2).tensors, _state(2))


def test_publisher_killed_mid_publish_leaves_previous_version(store: objects.FileStore) -> None:
    class Killed(Exception):
        pass

    def die_after_two(index: int, count: int) -> None:
        if index == 2:
            raise Killed

    _publisher(store).publish(_state(1), 1)
    with pytest.raises(Killed):
        _publisher(store, on_bucket=die_after_two).publish(_state(2), 2)
    reader = pull.Reader(store, PREFIX)
    assert reader.latest() == 1
    with pytest.raises(errors.NotFound):
        reader.pull(2)
    _assert_same(reader.pull(1).tensors, _state(1))
    assert store.exists(layout.bucket_key(PREFIX, 2, 0))
    # A restarted publisher sweeps the leftovers and can publish the same version again.
    restarted = _publisher(store)
    assert not store.exists(layout.bucket_key(PREFIX, 2, 0))
    restarted.publish(_state(3), 2)
    _assert_same(reader.pull(2).tensors, _state(3))


def test_corrupted_bucket_is_rejected_whole(store: objects.FileStore) -> None:
    manifest = _publisher(store).publish(_state(1), 1)
    path = store.root / manifest.buckets[3].key
    data = bytearray(path.read_bytes())
    data[17] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(layout.CorruptVersion, match="bucket00003"):
        pull.Reader(store, PREFIX).pull(1)


def test_truncated_or_missing_bucket_is_rejected(store: objects.FileStore) -> None:
    manifest = _publisher(store).publish(_state(1), 1)
    path = store.root / manifest.buckets[0].key
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(layout.CorruptVersion, match="bytes stored"):
        pull.Reader(store, PREFIX).pull(1)
    path.unlink()
    with pytest.raises(layout.CorruptVersion, match="missing"):
        pull.Reader(store, PREFIX).pull(1)


def test_old_versions_are_deleted_past_the_window(store: objects.FileStore) -> None:
    pub = _publisher(store, staleness_window=1)
    for v in range(1, 5):
        pub.publish(_state(v), v)
    assert pub.known_versions() == [3, 4]
    reader = pull.Reader(store, PREFIX)
    for v in (1, 2):
        with pytest.raises(errors.NotFound):
            reader.pull(v)
        assert not (store.root / layout.version_dir(PREFIX, v)).exists()
    _assert_same(reader.pull(3).tensors, _state(3))


def test_restarted_publisher_adopts_versions_for_gc(store: objects.FileStore) -> None:
    first = _publisher(store, staleness_window=0)
    first.publish(_state(1), 1)
    second = _publisher(store, staleness_window=0)
    assert second.latest == 1 and second.known_versions() == [1]
    second.publish(_state(2), 2)
    assert second.known_versions() == [2]
    assert not store.exists(layout.manifest_key(PREFIX, 1))


def test_versions_must_increase(store: objects.FileStore) -> None:
    pub = _publisher(store)
    pub.publish(_state(1), 5)
    for v in (5, 4):
        with pytest.raises(errors.Conflict):
            pub.publish(_state(2), v)
    with pytest.raises(errors.Conflict):
        _publisher(store).publish(_state(2), 5)


def test_bad_input_stores_nothing(store: objects.FileStore) -> None:
    pub = _publisher(store)
    with pytest.raises(errors.SpecError) as exc:
        pub.publish({"ok": np.zeros(4, np.float32), "bad": "nope"}, 1)
    assert exc.value.field == "state_dict['bad']"
    with pytest.raises(errors.SpecError):
        pub.publish(_state(1), -1)
    assert list(store.root.rglob("*")) == []


def test_head_behind_the_manifest_is_repaired_by_probing(store: objects.FileStore) -> None:
    pub = _publisher(store)
    pub.publish(_state(1), 1)
    pub.publish(_state(2), 2)
    store.put(layout.head_key(PREFIX), b"1")  # as if the publisher died before moving HEAD
    assert pull.latest_version(store, PREFIX) == 2
    store.remove(layout.head_key(PREFIX))
    assert pull.latest_version(store, PREFIX) == 2
    assert pull.latest_version(store, "jobs/other") is None


def test_prefetch_returns_the_same_snapshot(store: objects.FileStore) -> None:
    _publisher(store).publish(_state(1), 1)
    reader = pull.Reader(store, PREFIX)
    try:
        snap = reader.prefetch(1).result(timeout=30)
    finally:
        reader.close()
    _assert_same(snap.tensors, _state(1))


def test_retrying_gives_up_after_the_deadline() -> None:
    now = [0.0]
    calls = []

    def flaky() -> int:
        calls.append(now[0])
        if len(calls) < 4:
            raise errors.Unavailable("down")
        return 42

    def sleep(s: float) -> None:
        now[0] += s

    assert objects.retrying("x", flaky, deadline_s=10, clock=lambda: now[0], sleep=sleep) == 42
    assert calls == pytest.approx([0.0, 0.05, 0.15, 0.35])
    calls.clear()

    def down() -> int:
        calls.append(now[0])
        raise errors.Unavailable("down")

    with pytest.raises(errors.Unavailable, match="after 2s"):
        objects.retrying("x", down, deadline_s=2, clock=lambda: now[0], sleep=sleep)
    assert now[0] - calls[0] <= 2


def test_pull_into_a_reused_buffer(store: objects.FileStore) -> None:
    pub = _publisher(store)
    m1 = pub.publish(_state(1), 1)
    pub.publish(_state(2), 2)
    reader = pull.Reader(store, PREFIX)
    buf = np.full(m1.layout_bytes + 100, 0xAB, dtype=np.uint8)
    snap = reader.pull(1, out=buf)
    _assert_same(snap.tensors, _state(1))
    assert np.shares_memory(snap.buffer, buf)
    _assert_same(reader.pull(2, out=buf).tensors, _state(2))
    with pytest.raises(errors.SpecError) as exc:
        reader.pull(2, out=buf[:10])
    assert exc.value.field == "out"
