"""Trainer SDK: batch conversion and ack timing (fake buffer), publish/commit rules (FileStore)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from treadle import errors
from treadle.client import batches, publisher
from treadle.v1 import buffer_pb2, common_pb2
from treadle.weights import objects, publish, pull


def _trajectory(tid: str, group: str, reward: float) -> common_pb2.Trajectory:
    turn = common_pb2.Turn(
        prompt_token_ids=[1, 2], output_token_ids=[3, 4, 5], output_logprobs=[-0.1, -0.2, -0.3],
        output_versions=[2, 2, 3],
    )  # fmt: skip
    return common_pb2.Trajectory(
        trajectory_id=tid, group_id=group, task="math", reward=reward, status="completed",
        init_version=2, min_version=2, max_version=3, group_size=2, turns=[turn],
    )  # fmt: skip


class FakeBuffer:
    """Hands out numbered batches and records every call, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def get_batch(
        self, *, batch_size: int, version: int, timeout_s: float, lease_s: float = 0.0
    ) -> Any:
        n = sum(1 for c in self.calls if c[0] == "get")
        self.calls.append(("get", version))
        return buffer_pb2.Batch(
            batch_id=f"b{n}",
            trajectories=[_trajectory(f"t{n}a", "g1", 1.0), _trajectory(f"t{n}b", "g1", 0.0)],
            evicted_groups=n,
        )

    async def ack(self, batch_id: str) -> int:
        self.calls.append(("ack", batch_id))
        return 2


async def test_batches_ack_one_step_later_and_read_the_version_each_time() -> None:
    buf = FakeBuffer()
    version = iter([4, 5, 6])
    seen = []
    async for batch in batches.Batches(buf, batch_size=2, version=lambda: next(version), max_batches=3):
        seen.append(batch.batch_id)
        assert buf.calls[-1] == ("get", int(batch.batch_id[1:]) + 4)  # not acked while in use
    assert seen == ["b0", "b1", "b2"]
    assert buf.calls == [
        ("get", 4), ("ack", "b0"), ("get", 5), ("ack", "b1"), ("get", 6), ("ack", "b2"),
    ]  # fmt: skip


async def test_a_batch_abandoned_mid_step_is_not_acked() -> None:
    buf = FakeBuffer()
    async for _ in batches.Batches(buf, batch_size=2, version=lambda: 0):
        break
    assert buf.calls == [("get", 0)]


def test_batch_conversion_keeps_tokens_versions_and_groups() -> None:
    raw = buffer_pb2.Batch(
        batch_id="b",
        trajectories=[_trajectory("a", "g1", 1.0), _trajectory("b", "g2", 0.5)],
        evicted_groups=1,
    )
    batch = batches.from_proto(raw)
    assert batch.rewards == [1.0, 0.5]
    assert list(batch.groups) == ["g1", "g2"]
    turn = batch.samples[0].turns[0]
    assert turn.output_token_ids == (3, 4, 5)
    assert turn.output_logprobs == pytest.approx((-0.1, -0.2, -0.3))
    assert turn.output_versions == (2, 2, 3)
    assert (batch.samples[0].min_version, batch.samples[0].max_version) == (2, 3)


@pytest.mark.parametrize(
    "kw,field", [({"batch_size": 0}, "batch_size"), ({"max_batches": -1}, "max_batches")]
)
def test_batches_reject_bad_arguments(kw: dict[str, int], field: str) -> None:
    args: dict[str, Any] = {"batch_size": 1, **kw}
    with pytest.raises(errors.SpecError) as exc:
        batches.Batches(FakeBuffer(), version=lambda: 0, **args)
    assert exc.value.field == field


class RecordingCommitter:
    def __init__(self) -> None:
        self.versions: list[int] = []

    async def commit_version(self, version: int, *, step: int = 0, mean_reward: float | None = None) -> Any:
        self.versions.append(version)
        return type("Reply", (), {"aborted_trajectory_ids": [f"stale-{version}"]})()


def _state(seed: int) -> dict[str, np.ndarray]:
    return {"w": np.full((4, 4), seed, dtype=np.float32)}


async def test_publish_then_commit_in_order(tmp_path: Path) -> None:
    store = objects.FileStore(tmp_path)
    committer = RecordingCommitter()
    pub = publisher.Publisher(publish.Publisher(store, "job", bucket_bytes=4096), committer=committer)
    first = await pub.publish_and_commit(_state(1))
    second = await pub.publish_and_commit(_state(2))
    assert (first.version, second.version) == (1, 2)
    assert second.aborted_trajectory_ids == ("stale-2",)
    assert committer.versions == [1, 2] and pub.committed == 2
    np.testing.assert_array_equal(pull.Reader(store, "job").pull(2).tensors["w"], _state(2)["w"])


async def test_commit_refuses_unpublished_or_old_versions(tmp_path: Path) -> None:
    committer = RecordingCommitter()
    pub = publisher.Publisher(publish.Publisher(objects.FileStore(tmp_path), "job"), committer=committer)
    with pytest.raises(errors.Conflict, match="publish it first"):
        await pub.commit(1)
    await pub.publish(_state(1))
    await pub.commit(1)
    with pytest.raises(errors.Conflict, match="not newer"):
        await pub.commit(1)
    assert committer.versions == [1]


async def test_local_mode_without_a_committer(tmp_path: Path) -> None:
    pub = publisher.Publisher(publish.Publisher(objects.FileStore(tmp_path), "job"))
    assert (await pub.publish_and_commit(_state(1))).aborted_trajectory_ids == ()
    assert pub.next_version() == 2


class RestartingBuffer(FakeBuffer):
    """Refuses (``Unavailable``) the first ack and the second fetch, as a buffer pod being replaced."""

    def __init__(self) -> None:
        super().__init__()
        self.refusals = {"ack": 1, "get": 0}
        self.gets = 0

    async def get_batch(self, **kw: Any) -> Any:
        self.gets += 1
        if self.gets == 2:
            raise errors.Unavailable("buffer.GetBatch: connection refused")
        return await super().get_batch(**kw)

    async def ack(self, batch_id: str) -> int:
        if self.refusals["ack"]:
            self.refusals["ack"] -= 1
            raise errors.Unavailable("buffer.Ack: connection refused")
        return await super().ack(batch_id)


async def test_batches_wait_out_a_restarting_buffer_and_ack_each_batch_once() -> None:
    buf = RestartingBuffer()
    seen = [b.batch_id async for b in batches.Batches(buf, batch_size=2, version=lambda: 0, max_batches=2)]
    assert seen == ["b0", "b1"]
    assert buf.calls == [("get", 0), ("ack", "b0"), ("get", 0), ("ack", "b1")]


async def test_batches_give_up_on_a_buffer_gone_for_longer_than_the_wait() -> None:
    class Gone(FakeBuffer):
        async def get_batch(self, **kw: Any) -> Any:
            raise errors.Unavailable("buffer.GetBatch: connection refused")

    with pytest.raises(errors.Unavailable, match=r"the buffer \(GetBatch\) did not answer within 0.1s"):
        async for _ in batches.Batches(Gone(), batch_size=2, version=lambda: 0, restart_wait_s=0.1):
            pass
