"""Keep the scheduler supplied with prompt groups: each dataset task's rows, and the seeds of each
task without a dataset (its environment makes the problem from the seed: ``feeding.Seeds``).

Driven by ``__main__`` (``run`` in a loop) and by the tests, with the scheduler injected (the gRPC
client, or anything with ``submit`` and ``stats``). Each ``tick``:

1. submits again any batch recorded but not acknowledged (a feeder that died mid-submit);
2. reads the scheduler's ``Stats``: trajectories ``pending`` admission, job-wide;
3. asks ``feeding.wanted_groups`` how many groups each unfinished task adds to reach the target
   (split by task weight), takes them from the task's ``Shuffle`` at its position, records batch and
   new position in Redis (``store``), submits them, and acknowledges.

Durability is record-then-submit with idempotent group ids (``group_id``), so a restart neither
repeats nor skips a row within an epoch (``store`` says why). The scheduler's own admission keeps
the staleness window; the feeder only keeps its queue from running dry.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Protocol

import prometheus_client
import redis.asyncio as aioredis
import redis.exceptions

from treadle import errors, metrics
from treadle.api import jobconfig
from treadle.data import reader
from treadle.data import rows as rows_mod
from treadle.policy import feeding
from treadle.services.feeder import store
from treadle.services.scheduler import protocol as scheduler_protocol
from treadle.v1 import scheduler_pb2

log = logging.getLogger(__name__)


class Scheduler(Protocol):
    async def submit(self, groups: Sequence[scheduler_pb2.PromptGroup]) -> scheduler_pb2.SubmitResponse: ...

    async def stats(self) -> scheduler_pb2.SchedulerStats: ...


def group_id(task: str, epoch: int, row_id: str) -> str:
    """Unique per (task, epoch, row) and the same on every submission of it: the scheduler's dedupe key."""
    return f"{task}:e{epoch}:{row_id}"


def seed_group_id(task: str, seed: int) -> str:
    """A seed task's group id, unique per (task, seed) and stable: the scheduler's dedupe key."""
    return f"{task}:s{seed}"


@dataclasses.dataclass
class Feed:
    """One task: its rows (options JSON built once; none for a seed task), order, group size and
    durable position."""

    task: str
    rows: Sequence[rows_mod.Row]
    options: Sequence[str]
    """``options_json`` of each row's group."""
    shuffle: feeding.Order
    members: int
    """Trajectories per group (group size plus redundancy), as the scheduler counts them."""
    weight: float
    store: store.PositionStore
    position: feeding.Position = dataclasses.field(default_factory=feeding.Position)
    unacked: tuple[feeding.Position, int] | None = None
    """Start and size of a batch recorded but not yet acknowledged by the scheduler."""

    def groups(self, start: feeding.Position, size: int) -> list[scheduler_pb2.PromptGroup]:
        """The groups of the batch of ``size`` slots from ``start`` (the same on every call)."""
        slots, _ = self.shuffle.take(start, size)
        if isinstance(self.shuffle, feeding.Seeds):
            return [
                scheduler_pb2.PromptGroup(
                    group_id=seed_group_id(self.task, s.row), task=self.task, seed=s.row
                )
                for s in slots
            ]
        return [
            scheduler_pb2.PromptGroup(
                group_id=group_id(self.task, s.epoch, self.rows[s.row].row_id),
                task=self.task,
                seed=s.row,
                options_json=self.options[s.row],
            )
            for s in slots
        ]


@dataclasses.dataclass(frozen=True)
class TaskRows:
    """A task's rows as read at start, with each row's group options (none: a seed task)."""

    task: jobconfig.FeedTask
    rows: list[rows_mod.Row]
    options: list[str]


def read_datasets(cfg: jobconfig.FeederConfig, *, mount: PurePosixPath) -> list[TaskRows]:
    """Every task's rows (a task without a dataset has none); ``SpecError`` naming
    ``spec.tasks[i].dataset...`` for a dataset that cannot be used."""
    out = []
    hf_cache = Path(cfg.hf_cache) if cfg.hf_cache is not None else None
    for task in cfg.tasks:
        if task.dataset is None:
            out.append(TaskRows(task, [], []))
            continue
        field = f"spec.tasks[{task.index}].dataset"
        rows = reader.load(task.dataset, field=field, mount=mount, hf_cache=hf_cache)
        options = [json.dumps({rows_mod.OPTION: r.option()}, separators=(",", ":")) for r in rows]
        for row, text in zip(rows, options, strict=True):
            if len(text) > scheduler_protocol.MAX_OPTIONS_BYTES:
                raise errors.SpecError(
                    f"row {row.row_id!r} takes {len(text)} bytes as a group's options; the scheduler takes "
                    f"at most {scheduler_protocol.MAX_OPTIONS_BYTES}", field=field,
                )  # fmt: skip
        out.append(TaskRows(task, rows, options))
    return out


def feeds(datasets: Sequence[TaskRows], *, client: aioredis.Redis, namespace: str) -> list[Feed]:
    """One ``Feed`` per task, its position keyed by the rows' digest (``store``; ``seeds`` for a task
    without a dataset)."""
    out = []
    for d in datasets:
        task = d.task
        order: feeding.Order
        if task.dataset is None:
            order, digest = feeding.Seeds(), "seeds"
        else:
            digest = hashlib.blake2b("\n".join(d.options).encode(), digest_size=8).hexdigest()
            order = feeding.Shuffle(len(d.rows), seed=task.dataset.shuffle_seed, epochs=task.dataset.epochs)
        out.append(Feed(
            task=task.name, rows=d.rows, options=d.options, members=task.members, weight=task.weight,
            shuffle=order, store=store.PositionStore(client, store.key(namespace, task.name, digest)),
        ))  # fmt: skip
    return out


class FeederService:
    def __init__(
        self,
        *,
        feeds: Sequence[Feed],
        scheduler: Scheduler,
        target_pending: int,
        registry: prometheus_client.CollectorRegistry,
    ) -> None:
        self.feeds, self.scheduler, self.target_pending = list(feeds), scheduler, target_pending
        self.restored = False
        self._fed = prometheus_client.Counter(
            metrics.FEEDER_ROWS_FED_TOTAL, "Dataset rows the scheduler accepted as new groups", ["task"],
            registry=registry,
        )  # fmt: skip
        self._epoch = prometheus_client.Gauge(
            metrics.FEEDER_EPOCH, "Epoch the feeder is in (epochs when done)", ["task"], registry=registry
        )
        self._position = prometheus_client.Gauge(
            metrics.FEEDER_POSITION, "Rows of the current epoch submitted", ["task"], registry=registry
        )
        rows_gauge = prometheus_client.Gauge(
            metrics.FEEDER_ROWS, "Rows in the task's dataset", ["task"], registry=registry
        )
        for feed in self.feeds:
            rows_gauge.labels(feed.task).set(len(feed.rows))
            self._fed.labels(feed.task)

    async def restore(self) -> None:
        """Load each task's position (and unacknowledged batch) from Redis."""
        for feed in self.feeds:
            record = await feed.store.load()
            if record is not None:
                feed.position = record.position
                feed.unacked = None if record.acked else (record.batch, record.batch_size)
                log.info("task %s: resuming at %s%s", feed.task, record.position,
                         "" if record.acked else f" after resubmitting {record.batch_size} rows")  # fmt: skip
            self._show(feed)
        self.restored = True

    def done(self) -> bool:
        return all(f.unacked is None and f.shuffle.done(f.position) for f in self.feeds)

    async def tick(self) -> int:
        """One round (see the module docstring); returns the groups the scheduler accepted as new."""
        accepted = 0
        for feed in self.feeds:
            if feed.unacked is not None:
                accepted += await self._submit(feed, *feed.unacked)
        active = [f for f in self.feeds if not f.shuffle.done(f.position)]
        if not active:
            return accepted
        stats = await self.scheduler.stats()
        wanted = feeding.wanted_groups(
            pending=stats.pending, target=self.target_pending,
            members=[f.members for f in active], weights=[f.weight for f in active],
        )  # fmt: skip
        for feed, count in zip(active, wanted, strict=True):
            slots, after = feed.shuffle.take(feed.position, count)
            if not slots:
                continue
            batch = feed.position
            await feed.store.record(batch, len(slots), after)
            feed.position, feed.unacked = after, (batch, len(slots))
            accepted += await self._submit(feed, batch, len(slots))
        return accepted

    async def run(self, *, interval_s: float, stop: asyncio.Event) -> None:
        """Tick every ``interval_s`` until ``stop`` is set or every epoch of every task is fed.

        The scheduler's backpressure and outages, and Redis outages, are waited out (the batch stays
        unacknowledged and is submitted again); bad input (``SpecError``) ends the run.
        """
        while not stop.is_set():
            try:
                if not self.restored:
                    await self.restore()
                await self.tick()
            except (
                errors.Overloaded,
                errors.Unavailable,
                TimeoutError,
                redis.exceptions.ConnectionError,
            ) as exc:
                log.warning("feeding paused (retrying in %.1fs): %s", interval_s, exc)
            if self.done():
                log.info("every epoch of every dataset task is fed")
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)

    async def _submit(self, feed: Feed, start: feeding.Position, size: int) -> int:
        reply = await self.scheduler.submit(feed.groups(start, size))
        await feed.store.ack()
        feed.unacked = None
        self._fed.labels(feed.task).inc(reply.accepted_groups)
        self._show(feed)
        return reply.accepted_groups

    def _show(self, feed: Feed) -> None:
        self._epoch.labels(feed.task).set(feed.position.epoch)
        self._position.labels(feed.task).set(feed.position.offset)

    def status(self) -> list[dict[str, object]]:
        """Per task: epoch, offset, rows, rows fed over all epochs, done (``GET /v1/feeds``)."""
        return [
            {"task": f.task, "epoch": f.position.epoch, "offset": f.position.offset, "rows": len(f.rows),
             "fed": f.shuffle.fed(f.position), "done": f.shuffle.done(f.position) and f.unacked is None}
            for f in self.feeds
        ]  # fmt: skip
