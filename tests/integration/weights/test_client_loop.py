"""The trainer SDK against real parts: the buffer's gRPC server and a real Mooncake store pool.

One training-loop iteration end to end on the trainer side: batches come from the buffer over
gRPC (acked when the next is requested), weights go to Mooncake store processes, and the commit is
refused until the manifest is there.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest

from treadle import errors
from treadle.client import batches, publisher
from treadle.services.buffer import client as buffer_client
from treadle.services.buffer import grpc_server as buffer_server
from treadle.services.buffer import service as buffer_service
from treadle.services.buffer import store as buffer_store
from treadle.testing import mooncake_master as mooncake_master_mod
from treadle.v1 import common_pb2
from treadle.weights import mooncake_client, publish, pull, store


@pytest.fixture
async def buffer() -> AsyncIterator[buffer_client.BufferClient]:
    svc = buffer_service.BufferService(store=buffer_store.MemoryStore(), alpha=1)
    served = await buffer_server.build_server(svc)
    client = buffer_client.BufferClient(f"127.0.0.1:{served.port}")
    try:
        yield client
    finally:
        await client.aclose()
        await served.stop(None)


@pytest.fixture
def pool(mooncake_master: mooncake_master_mod.MooncakeMaster) -> Iterator[mooncake_client.MooncakeConfig]:
    addr, meta = mooncake_master.master_address, mooncake_master.metadata_url
    with contextlib.ExitStack() as stack:
        for _ in range(2):
            stack.enter_context(store.spawned(addr, meta, segment="64MiB"))
        yield mooncake_client.MooncakeConfig(addr, meta, replicas=2)


def _group(gid: str, rewards: list[float], version: int) -> list[common_pb2.Trajectory]:
    return [
        common_pb2.Trajectory(
            trajectory_id=f"{gid}-{i}", group_id=gid, task="math", reward=r, status="completed",
            group_size=len(rewards), init_version=version, min_version=version, max_version=version,
            turns=[common_pb2.Turn(prompt_token_ids=[1], output_token_ids=[7, 8],
                                   output_logprobs=[-1.0, -2.0], output_versions=[version, version])],
        )
        for i, r in enumerate(rewards)
    ]  # fmt: skip


class Recorder:
    def __init__(self) -> None:
        self.versions: list[int] = []

    async def commit_version(self, version: int, *, step: int = 0, mean_reward: float | None = None) -> Any:
        self.versions.append(version)
        return None


async def test_batches_from_the_real_buffer_then_publish_and_commit(
    buffer: buffer_client.BufferClient, pool: mooncake_client.MooncakeConfig
) -> None:
    await buffer.put(_group("g1", [1.0, 0.0], 0) + _group("g2", [0.5, 0.5], 0))
    trainer_store = mooncake_client.MooncakeStore(pool)
    reader_store = mooncake_client.MooncakeStore(pool)
    prefix = f"job/{uuid.uuid4().hex[:8]}"
    recorder = Recorder()
    pub = publisher.Publisher(
        publish.Publisher(trainer_store, prefix, bucket_bytes=64 * 1024), committer=recorder
    )
    try:
        got = []
        async for batch in batches.Batches(
            buffer, batch_size=4, version=lambda: pub.committed, max_batches=1
        ):
            got.append(batch)
            assert (await buffer.stats()).leased_batches == 1
            weights = {"w": np.full((128, 128), 3.0, dtype=np.float32), "b": np.arange(5, dtype=np.int64)}
            with pytest.raises(errors.Conflict):
                await pub.commit(1)  # nothing published yet
            committed = await pub.publish_and_commit(weights)
        stats = await buffer.stats()
        assert stats.acked == 4 and stats.leased_batches == 0
        [batch] = got
        assert sorted(batch.groups) == ["g1", "g2"]
        assert sorted(batch.rewards) == [0.0, 0.5, 0.5, 1.0]
        assert batch.samples[0].turns[0].output_token_ids == (7, 8)
        assert committed.version == 1 and recorder.versions == [1]
        snap = pull.Reader(reader_store, prefix).pull(1)
        np.testing.assert_array_equal(snap.tensors["w"], weights["w"])
        np.testing.assert_array_equal(snap.tensors["b"], weights["b"])
    finally:
        trainer_store.close()
        reader_store.close()
