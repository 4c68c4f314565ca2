"""The scheduler's durable record of its accepted work and committed version, so a restarted
scheduler goes on where the killed one stopped: no accepted group lost, no stored member run again.

Used by ``service.SchedulerService`` (``submit`` records, ``recover`` reads back) and by
``__main__`` (``RedisJournal`` when the pod has a Redis URL; ``MemoryJournal`` otherwise, which is
what a scheduler without Redis had before: nothing survives the process).

What is recorded, and when:

* **Accepted groups**, before ``Submit`` answers: a group the feeder was told is accepted is in
  Redis, so its acknowledgement (``feeder.store``) never covers work only held in memory. A
  failed write refuses the whole request (``Unavailable``) and queues nothing: the feeder submits
  the batch again.
* **Members stored**, after the buffer took them (or DARTS left them out): a recovered group runs
  only its members that were not stored. Written behind the run (``Writer``): a mark lost in a
  crash costs one member run again, which the buffer's idempotent put stores once.
* **Groups done**, when every member was stored: the record goes and the finished count (the
  admission window's ``accepted``) grows by the group's members.
* **The committed version** with its step and mean reward: admission's window, the staleness check
  and the job's status go on from it, not from 0.

Redis keys (``{<namespace>}`` is the job's key prefix, one hash slot per job):
``treadle:sched:{ns}:groups`` (group id -> the group as JSON, with its order and pool),
``treadle:sched:{ns}:stored`` (``<group id>|<member>`` -> the group size a completed member was stored
with, ``NOT_COMPLETED`` for a failed or aborted one, ``LEFT_OUT``) and ``treadle:sched:{ns}:progress``
(version, step, mean_reward, finished: completed trajectories of the groups done).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import redis.asyncio as aioredis
import redis.exceptions

from treadle import errors
from treadle.api import jobconfig
from treadle.services.scheduler import protocol

log = logging.getLogger(__name__)
LEFT_OUT = -1
"""A member's mark when DARTS left it out of its group (counted, not stored)."""
NOT_COMPLETED = 0
"""A member's mark when it was stored failed or aborted: in its group, but not trainable."""
MAX_BACKOFF_S = 5.0


@dataclasses.dataclass(frozen=True)
class Group:
    """An accepted group as recorded: what was submitted, its order and its pool."""

    group: protocol.PromptGroup
    seq: int
    pool: int
    """Trajectories started for it (the task's members, or DARTS's pool)."""
    stored: dict[int, int] = dataclasses.field(default_factory=dict)
    """Member index -> the group size it was stored with if completed, else ``NOT_COMPLETED`` or
    ``LEFT_OUT``."""


@dataclasses.dataclass(frozen=True)
class State:
    progress: protocol.Progress
    finished: int
    """Completed trajectories of the groups done (the admission window's ``accepted``)."""
    groups: list[Group]
    """Groups accepted and not done, in acceptance order."""


EMPTY = State(progress=protocol.Progress(version=0, step=0, mean_reward=None), finished=0, groups=[])


class Journal(Protocol):
    async def load(self) -> State: ...

    async def accept(self, groups: Sequence[Group]) -> None:
        """Record ``groups`` durably before returning; ``Unavailable`` if they could not be."""

    def stored(self, group_id: str, member: int, size: int) -> None:
        """Note that ``member`` of ``group_id`` was stored with group size ``size`` (behind the run)."""

    def done(self, group_id: str, members: Iterable[int], finished: int) -> None:
        """Forget ``group_id`` (every member stored) and count ``finished`` trajectories (behind the run)."""

    def commit(self, progress: protocol.Progress) -> None:
        """Record the committed version (behind the run)."""

    async def aclose(self) -> None: ...


class MemoryJournal:
    """The journal of a scheduler without Redis; tests hand one to a second service to 'restart' it."""

    def __init__(self) -> None:
        self.groups: dict[str, Group] = {}
        self.progress = EMPTY.progress
        self.finished = 0

    async def load(self) -> State:
        groups = sorted(self.groups.values(), key=lambda g: g.seq)
        return State(
            self.progress, self.finished, [dataclasses.replace(g, stored=dict(g.stored)) for g in groups]
        )

    async def accept(self, groups: Sequence[Group]) -> None:
        for g in groups:
            self.groups[g.group.group_id] = g

    def stored(self, group_id: str, member: int, size: int) -> None:
        if (g := self.groups.get(group_id)) is not None:
            g.stored[member] = size

    def done(self, group_id: str, members: Iterable[int], finished: int) -> None:
        self.groups.pop(group_id, None)
        self.finished += finished

    def commit(self, progress: protocol.Progress) -> None:
        self.progress = progress

    async def aclose(self) -> None:
        return None


class RedisJournal:
    def __init__(self, client: aioredis.Redis, *, namespace: str) -> None:
        self._r = client
        base = f"treadle:sched:{{{namespace}}}"
        self.groups_key, self.stored_key, self.progress_key = (
            f"{base}:groups",
            f"{base}:stored",
            f"{base}:progress",
        )
        self._queue: asyncio.Queue[_Mark] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None

    @classmethod
    def from_url(cls, url: str, *, namespace: str) -> RedisJournal:
        return cls(aioredis.Redis.from_url(url, protocol=2), namespace=namespace)

    async def load(self) -> State:
        try:
            pipe = self._r.pipeline(transaction=True)
            for key in (self.groups_key, self.stored_key, self.progress_key):
                pipe.hgetall(key)
            raw_groups, raw_stored, raw = await pipe.execute()
        except redis.exceptions.RedisError as exc:
            raise errors.Unavailable(f"scheduler journal: reading Redis failed: {exc}") from exc
        raw_progress = {_text(k): _text(v) for k, v in raw.items()}
        by_id = {_text(gid): _group_from_json(_text(gid), _text(v)) for gid, v in raw_groups.items()}
        for field, size in raw_stored.items():
            gid, _, member = _text(field).rpartition("|")
            if (g := by_id.get(gid)) is not None:
                g.stored[int(member)] = int(size)
        mean = raw_progress.get("mean_reward", "")
        progress = protocol.Progress(
            version=int(raw_progress.get("version", 0)), step=int(raw_progress.get("step", 0)),
            mean_reward=float(mean) if mean else None,
        )  # fmt: skip
        return State(
            progress, int(raw_progress.get("finished", 0)), sorted(by_id.values(), key=lambda g: g.seq)
        )

    async def accept(self, groups: Sequence[Group]) -> None:
        if not groups:
            return
        mapping = {g.group.group_id: _group_to_json(g) for g in groups}
        try:
            await self._r.hset(self.groups_key, mapping=mapping)  # type: ignore[arg-type]
        except redis.exceptions.RedisError as exc:
            raise errors.Unavailable(
                f"scheduler journal: recording accepted groups in Redis failed: {exc}"
            ) from exc

    def stored(self, group_id: str, member: int, size: int) -> None:
        self._put(_Stored(f"{group_id}|{member}", size))

    def done(self, group_id: str, members: Iterable[int], finished: int) -> None:
        self._put(_Done(group_id, tuple(f"{group_id}|{m}" for m in members), finished))

    def commit(self, progress: protocol.Progress) -> None:
        self._put(progress)

    async def aclose(self) -> None:
        """Write what is queued (bounded: a Redis that is gone cannot hold the shutdown), then close."""
        if self._writer is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._queue.join(), 5.0)
            self._writer.cancel()
            await asyncio.gather(self._writer, return_exceptions=True)
        await self._r.aclose()

    def _put(self, mark: _Mark) -> None:
        self._queue.put_nowait(mark)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_forever(), name="scheduler journal")

    async def _write_forever(self) -> None:
        """Write queued marks in order, many per round trip; a failed round is retried as a whole."""
        delay = 0.1
        while True:
            marks = [await self._queue.get()]
            while not self._queue.empty():
                marks.append(self._queue.get_nowait())
            while True:
                try:
                    await self._write(marks)
                    break
                except redis.exceptions.RedisError as exc:
                    log.warning(
                        "scheduler journal: writing %d marks to Redis failed (retrying in %.1fs): %s",
                        len(marks), delay, exc,
                    )  # fmt: skip
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, MAX_BACKOFF_S)
            delay = 0.1
            for _ in marks:
                self._queue.task_done()

    async def _write(self, marks: list[_Mark]) -> None:
        pipe = self._r.pipeline(transaction=True)
        for mark in marks:
            if isinstance(mark, _Stored):
                pipe.hset(self.stored_key, mark.field, str(mark.size))
            elif isinstance(mark, _Done):
                pipe.hdel(self.groups_key, mark.group_id)
                if mark.fields:
                    pipe.hdel(self.stored_key, *mark.fields)
                pipe.hincrby(self.progress_key, "finished", mark.finished)
            else:
                mean = "" if mark.mean_reward is None else repr(mark.mean_reward)
                pipe.hset(
                    self.progress_key,
                    mapping={"version": str(mark.version), "step": str(mark.step), "mean_reward": mean},
                )
        await pipe.execute()


@dataclasses.dataclass(frozen=True)
class _Stored:
    field: str
    size: int


@dataclasses.dataclass(frozen=True)
class _Done:
    group_id: str
    fields: tuple[str, ...]
    finished: int


_Mark = _Stored | _Done | protocol.Progress


def _group_to_json(g: Group) -> str:
    p = g.group
    body = {"seq": g.seq, "pool": g.pool, "task": p.task, "seed": p.seed, "options_json": p.options_json}
    return json.dumps(body, separators=(",", ":"))


def _group_from_json(group_id: str, text: str) -> Group:
    body = json.loads(text)
    group = protocol.PromptGroup(
        group_id=group_id, task=body["task"], seed=body["seed"], options_json=body["options_json"]
    )
    return Group(group=group, seq=body["seq"], pool=body["pool"])


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class OpenGroups:
    """The groups a scheduler accepted and has not wholly stored, marked in its journal member by member."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._open: dict[str, _Open] = {}
        self._seq = itertools.count()
        self._completed_before: dict[str, int] = {}
        """Of a partly stored group taken up after a restart: its members stored completed before."""

    async def accept(self, works: Sequence[protocol.Work], submitted: Sequence[protocol.PromptGroup]) -> None:
        """Record ``works`` (made from ``submitted``) in the journal, in acceptance order."""
        by_id = {g.group_id: g for g in submitted}
        await self.journal.accept([Group(by_id[w.group_id], seq=next(self._seq), pool=w.size) for w in works])

    def opened(self, works: Sequence[protocol.Work]) -> None:
        for w in works:
            running = set(w.indices)  # a recovered group's other members were accounted before the restart
            before = [i for i in range(w.size) if i not in running]
            self._open[w.group_id] = _Open(
                running, before, completed=self._completed_before.pop(w.group_id, 0)
            )

    def accounted(self, group_id: str, trajectory_id: str, mark: int) -> None:
        """A member is stored (``mark``: its group size if completed, ``NOT_COMPLETED``, ``LEFT_OUT``);
        its group goes once all are."""
        group = self._open.get(group_id)
        member = int(trajectory_id.rsplit("-", 1)[1])
        if group is None or member not in group.remaining:
            return
        group.remaining.discard(member)
        group.accounted.append(member)
        group.completed += mark > 0
        if group.remaining:
            self.journal.stored(group_id, member, mark)
        else:
            del self._open[group_id]
            self.journal.done(group_id, group.accounted, finished=group.completed)

    def restore(
        self, groups: Sequence[Group], tasks: Mapping[str, jobconfig.TaskConfig]
    ) -> tuple[list[protocol.Work], list[str]]:
        """After a restart: what each partly stored group of ``groups`` still needs, and the ids of those
        that need nothing (forgotten); new groups are ordered after all of ``groups``."""
        self._seq = itertools.count(max((g.seq for g in groups), default=-1) + 1)
        works, whole = [], []
        for g in (g for g in groups if g.stored):
            [work] = protocol.validate_groups([g.group], tasks)
            if (rest := self._rest(g, work)) is not None:
                works.append(rest)
            else:
                whole.append(g.group.group_id)
        return works, whole

    def _rest(self, g: Group, work: protocol.Work) -> protocol.Work | None:
        """As many of ``g``'s unstored members as make up the group it is stored as (a DARTS group whose
        surplus was being left out needs fewer than are missing); None if it needs nothing."""
        in_group = [s for s in g.stored.values() if s != LEFT_OUT]
        sizes = [s for s in in_group if s > 0]
        size = max(sizes) if sizes else (work.task.group_size if work.task.sampling == "darts" else g.pool)
        missing = [i for i in range(g.pool) if i not in g.stored]
        needed = missing[: max(0, size - len(in_group))]
        left_out = [i for i in missing if i not in needed]
        if not needed:
            self.journal.done(g.group.group_id, [*g.stored, *left_out], finished=len(sizes))
            return None
        for i in left_out:  # surplus that was being left out when the scheduler died: left out now
            self.journal.stored(g.group.group_id, i, LEFT_OUT)
        self._completed_before[g.group.group_id] = len(sizes)
        return dataclasses.replace(work, pool=g.pool, only=tuple(needed), stored_size=size)


@dataclasses.dataclass
class _Open:
    remaining: set[int]
    """Member indices started and not yet stored."""
    accounted: list[int]
    """Member indices stored (or left out)."""
    completed: int = 0
    """Members stored completed (trainable)."""
