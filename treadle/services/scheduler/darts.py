"""DARTS in the live scheduler (arXiv 2605.30859, docs/DARTS.md): pool sizes, early stop, selection.

Owned by ``SchedulerService`` for tasks whose ``sampling`` is ``darts`` (the others never reach it).
The decisions are ``treadle.policy.darts``'s, the same code the simulator runs; this module applies
them to trajectories:

* **A step is one ``submit`` call** (the driver's or the feeder's prompt batch): its DARTS groups of
  each task are sized together by ``policy.darts.plan.pools`` (``plan``), from the task's length
  statistics and the per-token latency fitted from this scheduler's own measurements (``Latency``).
  ``Work.pool`` carries each group's ``M'_i``; admission and the turn loop start that many.
* **Early stop** (saturated groups, ``M'_i >= M_up``): once ``M`` valid (not truncated) candidates are
  in, the rest of the pool is aborted for real: ``TurnLoop.abort`` cancels the trajectory (its env
  session is closed on the way out) and ABORTs its generation on its worker (the agent aborts the
  vLLM request). Those candidates are stored as ``aborted`` with reason ``darts: early stop``.
* **Dual-end** groups wait for the whole pool, then ``selection.select`` picks ``M`` (K shortest plus
  L longest valid).
* **What the buffer gets**: the selected ``M`` as the GRPO group (``group_size = M``), so the trainer's
  advantages are over them only. The rest are counted (metrics, the scheduler's ``aborted``) and
  stored only with ``keepUnselected``: then as ``aborted`` members of the same group (``group_size`` =
  the pool), which the trainer, taking completed members, never trains on. A pool with fewer than
  ``M`` completed candidates (failures) is stored whole, as standard GRPO stores its failures.
* **Length** of a candidate: ``TaskConfig.length`` (total generated tokens by default, turns, or
  wall milliseconds); **truncated**: its last turn used the whole ``max_tokens``.
* **Statistics**: when a step's pools are all in, ``stats.update`` with each prompt's lengths (aborted
  candidates at their censored length) and the new state is saved
  (``darts_store``, Redis in a cluster), so a restarted scheduler plans from it.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import prometheus_client as prom

from treadle import errors, metrics
from treadle.api import jobconfig
from treadle.policy.darts import budget, plan, selection, stats
from treadle.services.scheduler import darts_store, prediction, protocol, trajectory, turns
from treadle.v1 import common_pb2

log = logging.getLogger(__name__)
EARLY_STOP = "darts: early stop"
UNSELECTED = "darts: unselected"
PTL_WINDOW = 2048
"""Per-token latency samples kept (the latest turns): the engine's speed drifts with context length."""
PTL_BINS_PER_OCTAVE = 2
"""Batch sizes are pooled in half-octave bins before the fit: ``fit_ptl`` tries every pair of
breakpoints, so it gets one point per bin (a few dozen), not one per sample."""
Save = Callable[[common_pb2.Trajectory, protocol.TrajectoryResult], None]


class Latency:
    """Per-token latency against the running batch size, measured on every generation (App. A).

    A sample is (turns generating on the worker when the turn started, itself included; seconds of
    the generation call / its output tokens). Prefill and queueing in the engine are in the
    seconds, as they are in the decode time the budget prices. ``fitted`` is ``None`` until the
    samples span ``MIN_BATCHES`` bins (``fit_ptl`` needs 4 distinct batch sizes): ``plan.pools``
    then falls back to standard sampling.
    """

    MIN_BATCHES = 4

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.samples: collections.deque[tuple[int, float]] = collections.deque(maxlen=PTL_WINDOW)
        self.generating: collections.Counter[str] = collections.Counter()
        self.workers: set[str] = set()

    def measure(self, worker: str) -> Callable[[int], None]:
        """Call at the start of a generation on ``worker``; call what it returns with the output tokens
        at the end (0: aborted or failed, not a sample)."""
        self.generating[worker] += 1
        batch, began = self.generating[worker], self.clock()

        def done(tokens: int) -> None:
            self.generating[worker] -= 1
            if tokens > 0:
                self.samples.append((batch, (self.clock() - began) / tokens))
                self.workers.add(worker)

        return done

    def fitted(self) -> budget.Ptl | None:
        bins: dict[int, list[tuple[int, float]]] = collections.defaultdict(list)
        for batch, seconds in self.samples:
            bins[round(math.log2(batch) * PTL_BINS_PER_OCTAVE)].append((batch, seconds))
        if len(bins) < self.MIN_BATCHES:
            return None
        points = [
            (sum(b for b, _ in xs) / len(xs), max(budget.MIN_PTL_S, sum(s for _, s in xs) / len(xs)))
            for xs in bins.values()
        ]
        try:
            return budget.fit_ptl(points)
        except errors.SpecError as exc:  # degenerate points: price nothing rather than guess
            log.info("DARTS: no per-token latency fit from %d bins: %s", len(points), exc)
            return None


@dataclasses.dataclass
class _Member:
    traj: common_pb2.Trajectory
    result: protocol.TrajectoryResult
    length: int
    truncated: bool


@dataclasses.dataclass
class _Step:
    task: str
    open: int
    """Pools of the step not finished yet."""
    observations: dict[str, stats.Observation] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class _Pool:
    work: protocol.Work
    step: _Step
    open: int
    """Members not finished yet."""
    done: dict[int, _Member] = dataclasses.field(default_factory=dict)
    """Completed members by their index in the pool (launch order)."""
    lost: list[_Member] = dataclasses.field(default_factory=list)
    """Failed or aborted members, in finish order."""
    censored: list[int] = dataclasses.field(default_factory=list)
    decided: bool = False
    stop_at: int = 0
    """Length of the last of the ``M`` valid candidates when early stop fired."""


class DartsMetrics:
    def __init__(self, registry_: prom.CollectorRegistry) -> None:
        def per_task(kind: type[prom.Counter] | type[prom.Gauge], name: str, doc: str, *labels: str) -> Any:
            return kind(name, doc, ["task", *labels], registry=registry_)

        self.candidates = per_task(
            prom.Counter, metrics.SCHED_DARTS_CANDIDATES_TOTAL, "DARTS candidates started"
        )
        self.selected = per_task(
            prom.Counter, metrics.SCHED_DARTS_SELECTED_TOTAL, "DARTS candidates stored as the GRPO group"
        )
        self.unselected = per_task(
            prom.Counter, metrics.SCHED_DARTS_UNSELECTED_TOTAL, "DARTS candidates completed and not selected"
        )
        self.aborted = per_task(
            prom.Counter, metrics.SCHED_DARTS_ABORTED_TOTAL, "DARTS candidates aborted in flight", "reason"
        )
        self.budget = per_task(
            prom.Gauge, metrics.SCHED_DARTS_BUDGET, "Total DARTS candidates of the last step"
        )
        self.ptl_samples = prom.Gauge(
            metrics.SCHED_DARTS_PTL_SAMPLES, "Per-token latency samples the budget is fitted from",
            registry=registry_,
        )  # fmt: skip


class Darts:
    def __init__(
        self,
        tasks: Mapping[str, jobconfig.TaskConfig],
        *,
        loop: turns.TurnLoop,
        save: Save,
        drop: Save,
        store: darts_store.StatsStore,
        registry_: prom.CollectorRegistry,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tasks = {name: t for name, t in tasks.items() if t.sampling == "darts"}
        self.loop, self.save, self.drop, self.store = loop, save, drop, store
        self.metrics = DartsMetrics(registry_)
        self.latency = Latency(clock)
        if self.tasks:
            loop.measure = self.latency.measure
        self.state: dict[str, stats.Stats] = {}
        self.pools: dict[str, _Pool] = {}
        self._budgets: dict[str, int] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._saving = asyncio.Lock()

    async def ready(self) -> None:
        """Load each DARTS task's saved statistics, once (before its first plan)."""
        for name, task in self.tasks.items():
            if name not in self.state:
                saved = await self.store.load(name)
                # setdefault: a submit that loaded first may have planned (and stepped) already
                self.state.setdefault(name, saved or stats.Stats(decay=task.ema_decay))

    def plan(self, works: list[protocol.Work]) -> list[protocol.Work]:
        """``works`` with each DARTS group's pool size; one step per task (no side effect but the
        budgets ``started`` reports)."""
        by_task: dict[str, list[int]] = collections.defaultdict(list)
        for i, w in enumerate(works):
            if w.task.name in self.tasks:
                by_task[w.task.name].append(i)
        if not by_task:
            return works
        ptl = self.latency.fitted()
        self.metrics.ptl_samples.set(len(self.latency.samples))
        out = list(works)
        for name, at in by_task.items():
            task = self.tasks[name]
            pools, total = plan.pools(
                self.state[name], [prediction.prompt_key(works[i]) for i in at], ptl, m=task.group_size,
                m_up=task.m_up, lam=task.lam, replicas=max(1, len(self.latency.workers)),
            )  # fmt: skip
            for i, pool in zip(at, pools, strict=True):
                out[i] = dataclasses.replace(works[i], pool=pool)
            self._budgets[name] = total
        return out

    def started(self, works: Sequence[protocol.Work]) -> None:
        """Track the pools of ``works`` (queued by admission): one step per task."""
        steps: dict[str, _Step] = {}
        for w in works:
            name = w.task.name
            if name not in self.tasks:
                continue
            step = steps.setdefault(name, _Step(name, 0))
            step.open += 1
            self.pools[w.group_id] = _Pool(w, step, open=w.members)
            self.metrics.candidates.labels(name).inc(w.members)
        for name in steps:
            self.metrics.budget.labels(name).set(self._budgets.pop(name, 0))

    def take(
        self, t: trajectory.Traj, traj: common_pb2.Trajectory, result: protocol.TrajectoryResult
    ) -> bool:
        """Hold, store or drop a finished DARTS candidate; ``False`` if ``t`` is not one."""
        pool = self.pools.get(t.work.group_id)
        if pool is None:
            return False
        task = t.work.task
        pool.open -= 1
        member = _Member(traj, result, _length(task, t, result), _truncated(task, t))
        if traj.status == "completed":
            pool.done[int(t.tid.rsplit("-", 1)[1])] = member
        else:
            if traj.reason.startswith(EARLY_STOP):
                pool.censored.append(max(member.length, pool.stop_at))
            pool.lost.append(member)
        if pool.decided:
            self._unselected(pool, member)
        elif selection.mode(pool.work.members, task.m_up) == selection.SHORTEST and selection.enough_valid(
            [m.truncated for m in pool.done.values()], task.group_size
        ):
            self._early_stop(pool)
        elif pool.open == 0:
            self._select(pool)
        if pool.open == 0:
            self._finished(pool)
        return True

    async def aclose(self) -> None:
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.store.aclose()

    # --- decisions ----------------------------------------------------------------------------------

    def _early_stop(self, pool: _Pool) -> None:
        """``M`` valid candidates are in: they are the group; abort the rest of the pool."""
        group = [i for i, m in pool.done.items() if not m.truncated]  # exactly M: checked per arrival
        pool.stop_at = max(pool.done[i].length for i in group)
        name, gid = pool.work.task.name, pool.work.group_id
        for i in range(pool.work.members):
            tid = f"{gid}-{i}"
            t = self.loop.inflight.get(tid)
            if t is None or t.abort_reason:
                continue
            self.metrics.aborted.labels(name, "early_stop").inc()
            worker = self.loop.abort(tid, f"{EARLY_STOP}: {len(group)} valid candidates are in")
            if worker is not None:
                self._spawn(_abort_on_worker(tid, worker))
        self._store(pool, group)

    def _select(self, pool: _Pool) -> None:
        """The whole pool is in: select ``M`` by the group's mode (all of it when fewer completed)."""
        task = pool.work.task
        index = sorted(pool.done)
        members = [pool.done[i] for i in index]
        if len(members) < task.group_size:  # failures ate the pool: store it whole, as standard does
            self._store(pool, index, whole=True)
            return
        chosen = selection.select(
            [m.length for m in members], [m.truncated for m in members], task.group_size,
            task.group_size - task.long_end, m_up=task.m_up,
        )  # fmt: skip
        self._store(pool, [index[j] for j in chosen])

    def _store(self, pool: _Pool, group: Sequence[int], *, whole: bool = False) -> None:
        task = pool.work.task
        pool.decided = True
        size = pool.work.members if whole or task.keep_unselected else task.group_size
        chosen = set(group)
        for i in group:
            member = pool.done[i]
            member.traj.group_size = size
            self.save(member.traj, member.result)
        self.metrics.selected.labels(task.name).inc(len(group))
        for i, member in pool.done.items():
            if i not in chosen:
                self._unselected(pool, member)
        for member in pool.lost:
            if whole:
                member.traj.group_size = size
                self.save(member.traj, member.result)
            else:
                self._unselected(pool, member)

    def _unselected(self, pool: _Pool, member: _Member) -> None:
        """A candidate left out of the group: stored as aborted with ``keepUnselected``, else counted."""
        task = pool.work.task
        traj, result = member.traj, member.result
        if traj.status == "completed":
            self.metrics.unselected.labels(task.name).inc()
            reason = f"{UNSELECTED} ({selection.mode(pool.work.members, task.m_up)})"
            traj.status, traj.reason = "aborted", reason
            result = dataclasses.replace(result, status="aborted", reason=reason)
        if task.keep_unselected:
            traj.group_size = pool.work.members
            self.save(traj, result)
        else:
            self.drop(traj, result)

    def _finished(self, pool: _Pool) -> None:
        """The pool's last member is in: its lengths join the step; a finished step updates the stats."""
        del self.pools[pool.work.group_id]
        step, key = pool.step, prediction.prompt_key(pool.work)
        old = step.observations.get(key, stats.Observation(()))
        step.observations[key] = stats.Observation(
            old.lengths + tuple(m.length for m in pool.done.values()), old.censored + tuple(pool.censored)
        )
        step.open -= 1
        if step.open == 0:
            self.state[step.task] = stats.update(self.state[step.task], step.observations)
            self._spawn(self._persist(step.task))

    async def _persist(self, task: str) -> None:
        try:
            async with self._saving:  # one write at a time, each of the latest state: never an older one last
                await self.store.save(task, self.state[task])
        except Exception as exc:  # the next step saves again; planning goes on from memory
            log.warning("DARTS: saving the statistics of task %s failed: %r", task, exc)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


async def _abort_on_worker(tid: str, worker: Any) -> None:
    try:
        await worker
    except errors.TreadleError as exc:  # the cancelled trajectory is stored aborted either way
        log.info("DARTS: abort of %s on its worker failed: %s", tid, exc)


def _length(task: jobconfig.TaskConfig, t: trajectory.Traj, result: protocol.TrajectoryResult) -> int:
    if task.length == "turns":
        return len(t.turns)
    if task.length == "seconds":
        return round(result.seconds * 1000)
    return result.output_tokens


def _truncated(task: jobconfig.TaskConfig, t: trajectory.Traj) -> bool:
    return bool(t.turns) and len(t.turns[-1].output_token_ids) >= task.max_tokens
