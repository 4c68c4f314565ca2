"""Weight publication on a real mooncake_master with real store processes on 127.0.0.1.

Every test uses its own prefix. Tests that kill processes run against their own master with a
short client TTL, so the dead segment leaves the pool quickly and no other test meets it.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from treadle import errors
from treadle.testing import mooncake_master as mooncake_master_mod
from treadle.weights import layout, mooncake_client, publish, pull, store

HERE = Path(__file__).parent
BUCKET = 256 * 1024


def _state(seed: int, n: int = 6) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"w{i}": rng.standard_normal(64 * 1024).astype(np.float32) for i in range(n)}


def _same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> bool:
    return list(got) == list(want) and all(np.array_equal(got[k], want[k]) for k in want)


@pytest.fixture
def prefix() -> str:
    return f"test/{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def _stores(master: mooncake_master_mod.MooncakeMaster, n: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(store.spawned(master.master_address, master.metadata_url, segment="64MiB"))
            for _ in range(n)
        ]


@contextlib.contextmanager
def _client(
    master: mooncake_master_mod.MooncakeMaster, replicas: int = 2
) -> Iterator[mooncake_client.MooncakeStore]:
    client = mooncake_client.MooncakeStore(
        mooncake_client.MooncakeConfig(master.master_address, master.metadata_url, replicas=replicas)
    )
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def two_stores(
    mooncake_master: mooncake_master_mod.MooncakeMaster,
) -> Iterator[list[subprocess.Popen[bytes]]]:
    with _stores(mooncake_master, 2) as procs:
        yield procs


def test_round_trip_two_replicas(
    mooncake_master: mooncake_master_mod.MooncakeMaster, two_stores: object, prefix: str
) -> None:
    with _client(mooncake_master) as trainer, _client(mooncake_master) as inference:
        manifest = publish.Publisher(trainer, prefix, bucket_bytes=BUCKET).publish(_state(1), 1)
        assert len(manifest.buckets) == 6
        snap = pull.Reader(inference, prefix).pull(1)
        assert _same(snap.tensors, _state(1))
        for bucket in manifest.buckets:
            assert len(inference._client.get_replica_desc(bucket.key)) == 2


def test_fewer_stores_than_replicas_fails_the_publish(
    mooncake_master: mooncake_master_mod.MooncakeMaster, prefix: str
) -> None:
    with _stores(mooncake_master, 1), _client(mooncake_master, replicas=2) as trainer:
        pub = publish.Publisher(trainer, prefix, bucket_bytes=BUCKET, deadline_s=1.0)
        with pytest.raises(errors.Unavailable, match="1 complete replica"):
            pub.publish(_state(1), 1)
        assert pull.latest_version(trainer, prefix) is None


def test_reader_never_sees_a_version_before_its_manifest(
    mooncake_master: mooncake_master_mod.MooncakeMaster, two_stores: object, prefix: str
) -> None:
    with _client(mooncake_master) as trainer, _client(mooncake_master) as inference:
        reader = pull.Reader(inference, prefix)
        publish.Publisher(trainer, prefix, bucket_bytes=BUCKET).publish(_state(1), 1)
        checked = []

        def probe(index: int, count: int) -> None:
            assert reader.latest() == 1
            with pytest.raises(errors.NotFound):
                reader.pull(2)
            checked.append(index)

        publish.Publisher(trainer, prefix, bucket_bytes=BUCKET, on_bucket=probe).publish(_state(2), 2)
        assert checked == list(range(6))
        assert reader.latest() == 2
        assert _same(reader.pull(2).tensors, _state(2))


def test_corrupted_bucket_is_detected_and_rejected(
    mooncake_master: mooncake_master_mod.MooncakeMaster, two_stores: object, prefix: str
) -> None:
    with _client(mooncake_master) as trainer, _client(mooncake_master) as inference:
        manifest = publish.Publisher(trainer, prefix, bucket_bytes=BUCKET).publish(_state(1), 1)
        key = manifest.buckets[4].key
        good = np.empty(manifest.buckets[4].nbytes, dtype=np.uint8)
        inference.get_into(key, good)
        bad = good.copy()
        bad[1000] ^= 0x01  # one flipped bit, same size
        trainer.put(key, bad)
        with pytest.raises(layout.CorruptVersion, match="bucket00004"):
            pull.Reader(inference, prefix).pull(1)
        trainer.put(key, good[:-4].copy())  # truncated
        with pytest.raises(layout.CorruptVersion, match="bytes stored"):
            pull.Reader(inference, prefix).pull(1)


def test_old_versions_are_deleted(
    mooncake_master: mooncake_master_mod.MooncakeMaster, two_stores: object, prefix: str
) -> None:
    with _client(mooncake_master) as trainer:
        pub = publish.Publisher(trainer, prefix, bucket_bytes=BUCKET, staleness_window=1)
        keys = {v: [b.key for b in pub.publish(_state(v), v).buckets] for v in range(1, 5)}
        assert pub.known_versions() == [3, 4]
        for v in (1, 2):
            assert not trainer.exists(layout.manifest_key(prefix, v))
            assert not any(trainer.exists(k) for k in keys[v])
        for v in (3, 4):
            assert trainer.exists(layout.manifest_key(prefix, v))
            assert all(trainer.exists(k) for k in keys[v])


@pytest.fixture
def private_master() -> Iterator[mooncake_master_mod.MooncakeMaster]:
    """A master of our own with a 2 s client TTL: killed stores leave the pool fast."""
    with mooncake_master_mod.mooncake_master(client_ttl_s=2) as master:
        yield master


def test_killing_one_store_during_a_pull_still_completes(
    private_master: mooncake_master_mod.MooncakeMaster, prefix: str
) -> None:
    with (
        _stores(private_master, 2) as procs,
        _client(private_master) as trainer,
        _client(private_master) as inference,
    ):
        state = _state(7, n=8)
        publish.Publisher(trainer, prefix, bucket_bytes=BUCKET).publish(state, 1)
        killed = []

        def kill_first_store(index: int, count: int) -> None:
            if index == 1:
                procs[0].send_signal(signal.SIGKILL)
                procs[0].wait()
                killed.append(index)

        snap = pull.Reader(inference, prefix, deadline_s=30, on_bucket=kill_first_store).pull(1)
        assert killed == [1]
        assert _same(snap.tensors, state)


def test_killing_the_trainer_mid_publish_keeps_the_previous_version(
    private_master: mooncake_master_mod.MooncakeMaster, prefix: str
) -> None:
    with _stores(private_master, 2), _client(private_master) as inference:
        trainer = subprocess.Popen(
            [sys.executable, str(HERE / "trainer_proc.py"), private_master.master_address,
             private_master.metadata_url, prefix],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        assert trainer.stdout is not None
        try:
            lines = []
            killer = threading.Timer(60, trainer.kill)  # bounded: a hung child fails the test
            killer.start()
            while (line := trainer.stdout.readline()) and not line.startswith(b"v2 bucket 2"):
                lines.append(line)
            killer.cancel()
            assert lines == [b"committed 1\n"]
            assert line == b"v2 bucket 2\n"
            assert inference.exists(layout.bucket_key(prefix, 2, 2))  # v2 is half written ...
            trainer.send_signal(signal.SIGKILL)  # ... when the trainer dies
            trainer.wait()
        finally:
            if trainer.poll() is None:
                trainer.kill()
                trainer.wait()
        reader = pull.Reader(inference, prefix)
        assert reader.latest() == 1
        assert _same(reader.pull(1).tensors, _state(1))
        with pytest.raises(errors.NotFound):
            reader.pull(2)
        # The trainer lent no memory to the pool, so nothing it wrote died with it; a restarted
        # trainer sweeps the half-written v2 and publishes it again.
        with _client(private_master) as restarted:
            pub = publish.Publisher(restarted, prefix, bucket_bytes=BUCKET)
            assert not restarted.exists(layout.bucket_key(prefix, 2, 2))
            pub.publish(_state(3), 2)
        assert _same(reader.pull(2).tensors, _state(3))
