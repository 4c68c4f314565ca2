"""The trainer's iteration protocol with a fake buffer, scheduler and engines (real FileStore).

Checks the order RollArt prescribes (get_batch -> suspend -> swap -> commit -> resume -> train and
publish), that every batch is requested at the committed version, that each step's weights are
published as the next version and swapped in before the following batch is trained on, and that
batches without per-token versions or logprobs are refused.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from treadle import errors
from treadle.client import batches, publisher
from treadle.trainer import group, loop, parallel, policy, step
from treadle.v1 import buffer_pb2, common_pb2
from treadle.weights import layout, objects, publish

PREFIX = "unit/trainer"


def _trajectory(
    tid: str, group: str, reward: float, version: int, output: list[int]
) -> common_pb2.Trajectory:
    turn = common_pb2.Turn(
        prompt_token_ids=[3, 10, 11, 12], output_token_ids=output, output_logprobs=[-6.0] * len(output),
        output_versions=[version] * len(output),
    )  # fmt: skip
    return common_pb2.Trajectory(
        trajectory_id=tid, group_id=group, task="toy", reward=reward, status="completed",
        init_version=version, min_version=version, max_version=version, group_size=2, turns=[turn],
    )  # fmt: skip


class Recorder:
    """Fake buffer, scheduler gate and engine swapper sharing one event log."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.progress: list[tuple[int, int, float | None]] = []
        """(version, step, mean reward) as each commit said them."""
        self.served = 0

    async def get_batch(
        self, *, batch_size: int, version: int, timeout_s: float, lease_s: float = 0.0
    ) -> Any:
        n = sum(1 for e in self.events if e[0] == "get")
        self.events.append(("get", version))
        return buffer_pb2.Batch(
            batch_id=f"b{n}",
            trajectories=[
                _trajectory(f"t{n}a", f"g{n}", 1.0, self.served, [40, 41, 42]),
                _trajectory(f"t{n}b", f"g{n}", 0.0, self.served, [50, 51]),
            ],
        )

    async def ack(self, batch_id: str) -> int:
        self.events.append(("ack", batch_id))
        return 2

    async def suspend(self) -> object:
        self.events.append(("suspend", None))
        return None

    async def resume(self) -> object:
        self.events.append(("resume", None))
        return None

    async def commit_version(
        self, version: int, *, step: int = 0, mean_reward: float | None = None
    ) -> object:
        self.events.append(("commit", version))
        self.progress.append((version, step, mean_reward))
        return None

    async def prefetch(self, version: int) -> None:
        self.events.append(("prefetch", version))

    async def swap(self, version: int) -> None:
        self.events.append(("swap", version))
        self.served = version


@pytest.fixture
def world() -> Iterator[parallel.World]:
    yield parallel.init({})
    parallel.close()


def _trainer(
    tmp_path: pathlib.Path,
    pol: policy.Policy,
    rec: Recorder,
    steps: int,
    world: parallel.World,
    *,
    done: int = 0,
) -> loop.Trainer:
    weights = publish.Publisher(objects.FileStore(tmp_path / "w"), PREFIX, bucket_bytes=1 << 20)
    pub = publisher.Publisher(weights, committer=rec)
    parallel.shard(pol.model, world, bf16=False, checkpointing=False)
    return loop.Trainer(
        group.Group(world, pol, lr=1e-2, settings=step.Settings(), weights=weights),
        batches=batches.Batches(rec, batch_size=2, version=lambda: pub.committed, max_batches=steps - done,
                                acks="explicit"),
        publisher=pub, gate=rec, swapper=rec,
        # restart_wait_s: a refusal is final
        config=loop.Config(steps=steps, batch_size=2, restart_wait_s=0.1, steps_done=done),
    )  # fmt: skip


async def test_iteration_order_versions_and_publication(
    tmp_path: pathlib.Path, tiny_model_dir: pathlib.Path, world: parallel.World
) -> None:
    pol = policy.load(tiny_model_dir)
    before = {k: v.clone() for k, v in pol.model.state_dict().items()}
    rec = Recorder()
    history = await _trainer(tmp_path, pol, rec, steps=3, world=world).run()
    # A batch is acked only once the version trained on it is committed.
    assert rec.events == [
        ("get", 0), ("prefetch", 1),
        ("get", 0), ("suspend", None), ("swap", 1), ("commit", 1), ("resume", None), ("ack", "b0"),
        ("prefetch", 2),
        ("get", 1), ("suspend", None), ("swap", 2), ("commit", 2), ("resume", None), ("ack", "b1"),
        ("prefetch", 3),
        ("suspend", None), ("swap", 3), ("commit", 3), ("resume", None), ("ack", "b2"),
    ]  # fmt: skip
    assert [(r.step, r.version, r.published) for r in history] == [(1, 0, 1), (2, 0, 2), (3, 1, 3)]
    # Each batch was generated before the fence of its own step: by the version served until then.
    assert [r.token_versions for r in history] == [(0, 0), (0, 0), (1, 1)]
    assert all(r.samples == 2 and r.tokens == 5 for r in history)
    store = objects.FileStore(tmp_path / "w")
    assert store.exists(layout.manifest_key(PREFIX, 3))
    after = {k: v.full_tensor() for k, v in pol.model.state_dict().items()}
    assert any(not torch.equal(before[k], after[k]) for k in before), "the optimizer never stepped"
    assert [r.batch_id for r in history] == ["b0", "b1", "b2"]
    # Step 2's tokens are all clipped (the fixed behaviour logprobs are far from the stepped policy).
    assert history[0].grad_norm > 0 and all(r.entropy > 0 and r.trained_tokens == 13 for r in history)
    # Each commit says which step made the version and its batch's mean reward (rewards 1 and 0).
    assert rec.progress == [(1, 1, 0.5), (2, 2, 0.5), (3, 3, 0.5)]


async def test_a_refused_swap_resumes_the_scheduler_and_commits_nothing(
    tmp_path: pathlib.Path, tiny_model_dir: pathlib.Path, world: parallel.World
) -> None:
    class Refusing(Recorder):
        async def swap(self, version: int) -> None:
            self.events.append(("swap", version))
            raise errors.Unavailable("engine refused")

    rec = Refusing()
    trainer = _trainer(tmp_path, policy.load(tiny_model_dir), rec, steps=3, world=world)
    with pytest.raises(errors.Unavailable):
        await trainer.run()
    assert rec.events[-3:] == [("suspend", None), ("swap", 1), ("resume", None)]
    assert not any(e[0] in ("commit", "ack") for e in rec.events)  # the batch comes back after its lease
    assert trainer.publisher.committed == 0


@pytest.mark.parametrize("field", ["output_versions", "output_logprobs"])
def test_batches_without_token_versions_or_logprobs_are_refused(field: str) -> None:
    t = _trajectory("t", "g", 1.0, 0, [1, 2])
    del getattr(t.turns[0], field)[:]
    batch = batches.from_proto(buffer_pb2.Batch(batch_id="b", trajectories=[t]))
    with pytest.raises(errors.SpecError) as info:
        step.sequences(batch)
    assert info.value.field == f"turns.{field}"


def test_turns_without_output_are_skipped() -> None:
    batch = batches.from_proto(
        buffer_pb2.Batch(
            batch_id="b", trajectories=[_trajectory("a", "g", 1.0, 0, []), _trajectory("b", "g", 0.0, 0, [7])]
        )
    )
    seqs, owner = step.sequences(batch)
    assert owner == [1] and seqs == [([3, 10, 11, 12], [7], [-6.0])]


async def test_a_restarted_trainer_numbers_its_steps_after_those_done_and_stops_at_the_last(
    tmp_path: pathlib.Path, tiny_model_dir: pathlib.Path, world: parallel.World
) -> None:
    """A trainer restarted after 3 of 5 steps were committed trains steps 4 and 5 only."""
    rec = Recorder()
    history = await _trainer(tmp_path, policy.load(tiny_model_dir), rec, steps=5, world=world, done=3).run()
    assert [r.step for r in history] == [4, 5]
    assert [step for _, step, _ in rec.progress] == [4, 5]  # the job's status.step goes on, never back
    with pytest.raises(errors.SpecError, match="steps_done"):
        loop.Config(steps=5, steps_done=5)
