"""A restarted scheduler goes on from its journal (``scheduler.journal``): the committed version, every
accepted group not wholly stored (a partly stored one runs only what it still needs), and a submit
the journal cannot record is refused whole. The 'restart' is a second service over the same
``MemoryJournal``; the same over Redis and real processes is in tests/integration (fault suite)."""

from __future__ import annotations

import asyncio

import pytest
from test_scheduler import TASK, Stack

from treadle import errors
from treadle.services.scheduler import journal, protocol
from treadle.v1 import common_pb2


async def test_a_restarted_scheduler_runs_every_accepted_group_and_keeps_the_version() -> None:
    kept = journal.MemoryJournal()
    first = Stack(journal_=kept)
    first.agent.hold = asyncio.Event()  # nothing finishes before the 'kill'
    await first.submit("g1", "g2")
    await first.svc.commit_version(3, step=3, mean_reward=0.25)
    assert first.svc.stats().in_flight == 8
    await first.svc.aclose()  # killed: in-flight work is gone with it, nothing was stored

    second = Stack(journal_=kept)
    results = second.svc.results()
    recovered = await second.svc.recover()
    assert recovered == protocol.Recovery(version=3, groups=2, trajectories=8)
    assert second.svc.progress == protocol.Progress(version=3, step=3, mean_reward=0.25)
    done = await second.collect(8, results)
    assert done == sorted(f"{g}-{i}:completed" for g in ("g1", "g2") for i in range(4))
    stats = second.svc.stats()
    assert (stats.version, stats.submitted, stats.completed) == (3, 8, 8)
    await asyncio.sleep(0)
    assert kept.groups == {} and kept.finished == 8  # every group done: nothing left to recover
    # The feeder's resubmission of an acknowledged batch starts nothing twice.
    assert (await second.svc.submit([protocol.PromptGroup("g1", "math")])).accepted_groups == 0
    await second.svc.aclose()


async def test_a_partly_stored_group_runs_only_the_members_it_still_needs() -> None:
    kept = journal.MemoryJournal()
    stored = {0: 4, 2: 4}
    await kept.accept(
        [journal.Group(protocol.PromptGroup("g1", "math", seed=5), seq=0, pool=4, stored=stored)]
    )
    st = Stack(journal_=kept)
    before = [
        common_pb2.Trajectory(trajectory_id=f"g1-{i}", group_id="g1", task="math", agent=TASK.agent,
                              group_size=4, status="completed", reward=1.0)
        for i in stored
    ]  # fmt: skip
    await st.buffer.put(before)  # what the killed scheduler had stored
    results = st.svc.results()
    assert await st.svc.recover() == protocol.Recovery(version=0, groups=1, trajectories=2)
    assert await st.collect(2, results) == ["g1-1:completed", "g1-3:completed"]
    batch = await st.buffer.get_batch(batch_size=4, version=0, timeout_s=0)  # the group is whole again
    assert sorted((t.trajectory_id, t.group_size) for t in batch.trajectories) == [
        (f"g1-{i}", 4) for i in range(4)
    ]
    assert kept.groups == {} and kept.finished == 4
    await st.svc.aclose()


async def test_a_group_whose_surplus_was_being_left_out_runs_only_the_selected_size() -> None:
    """A DARTS pool of 6 stored as a group of 2: one member stored, two left out when the scheduler died;
    of the three missing, one more makes the group, the other two count as left out."""
    kept = journal.MemoryJournal()
    stored = {0: 2, 1: journal.LEFT_OUT, 2: journal.LEFT_OUT}
    await kept.accept([journal.Group(protocol.PromptGroup("g1", "math"), seq=0, pool=6, stored=stored)])
    st = Stack(journal_=kept)
    results = st.svc.results()
    assert await st.svc.recover() == protocol.Recovery(version=0, groups=1, trajectories=1)
    assert await st.collect(1, results) == ["g1-3:completed"]
    assert kept.groups == {} and kept.finished == 2  # the completed ones: the admission window's count
    await st.svc.aclose()


async def test_a_group_already_whole_is_only_forgotten() -> None:
    kept = journal.MemoryJournal()
    await kept.accept(
        [journal.Group(protocol.PromptGroup("g1", "math"), seq=0, pool=4, stored=dict.fromkeys(range(4), 4))]
    )
    st = Stack(journal_=kept)
    assert await st.svc.recover() == protocol.Recovery(version=0, groups=0, trajectories=0)
    assert kept.groups == {} and kept.finished == 4
    assert (await st.svc.submit([protocol.PromptGroup("g1", "math")])).accepted_groups == 0
    await st.svc.aclose()


class _Down(journal.MemoryJournal):
    def __init__(self) -> None:
        super().__init__()
        self.down = True

    async def accept(self, groups: object) -> None:
        if self.down:
            raise errors.Unavailable("scheduler journal: Redis is down")
        await super().accept(groups)  # type: ignore[arg-type]


async def test_a_submit_the_journal_cannot_record_is_refused_whole_and_can_be_repeated() -> None:
    kept = _Down()
    st = Stack(journal_=kept)
    with pytest.raises(errors.Unavailable, match="Redis is down"):
        await st.submit("g1", "g2")
    stats = st.svc.stats()
    assert (stats.submitted, stats.pending, stats.in_flight) == (0, 0, 0)
    kept.down = False
    results = st.svc.results()
    await st.submit("g1", "g2")  # the feeder's retry of the same batch
    assert len(await st.collect(8, results)) == 8
    await st.svc.aclose()
