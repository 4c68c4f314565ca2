"""Scheduler logic: the agent loop of every trajectory, admission, suspend/resume and version commits.

Built by ``grpc_server.build_server`` (``python -m treadle.services.scheduler``), by local mode and
by the benchmark, with its dependencies injected (``protocol.Env`` / ``Agent`` / ``Reward`` /
``Placement`` / ``Buffer``). One asyncio task per trajectory (RollArt's EnvManager: each runs on its
own timeline, so a slow environment never blocks another)::

    env.open -> [gate -> placement.assign -> agent.generate -> placement.release -> env.step]*
             -> env.close -> reward.score -> buffer.put (batched)

* **Admission** (``treadle.policy.admission``, AReaL's rule): whole groups start only while the
  trajectories started stay within ``(alpha + version + 1) * batch_size`` and ``max_in_flight``.
* **Per-iteration staleness check** (RollArt): ``commit_version(v)`` aborts every in-flight
  trajectory initiated before ``v - alpha`` (ABORT to its worker, status ``aborted``).
* **Suspend/resume**: while suspended no group starts and no new turn is issued; turns already
  generating finish (RollArt keeps in-flight trajectories across a weight swap).
* **Gate**: at most ``max_concurrent_generations`` turns generate at once; waiting turns are
  released in the order of the scheduling policy named in the job (``treadle.policy.registry``).
  Preemptive policies (``heddle``) ABORT a lower-ranked running turn for a higher-ranked waiting
  one; the agent drops the aborted turn's tokens, so the turn is re-generated from its prompt.
* **Prediction** (Heddle §4.1): one ``heddle.predictor.HistoryModel`` per task (siblings keyed by
  the prompt, ``_prompt_key``), learned from the task's completed trajectories (every
  ``LEARN_EVERY``, and before each admission round), predicts each trajectory's remaining
  tokens at admission and after every turn. The prediction ranks its turns, goes to placement with
  the turn's release (a batch-level policy may migrate the trajectory during its tool call) and is
  listed with its rank and worker by ``list_trajectories``.
* **Batch placement**: the trajectories of each admission round are handed to
  ``placement.place_batch`` together (Heddle's presorted DP); their first turn waits for it.
* **Failures**: ``Unavailable`` (and timeouts) from the environment or the reward gateway are
  retried with exponential backoff (``env.open`` moves to the next env server); after the last
  attempt, or on any other error, the trajectory is stored as ``failed`` with the reason. A reward
  gateway that scales to zero is waited for (``Settings.reward_unavailable_s``): its ``Unavailable``
  is retried for that long, however many attempts it takes. A
  generation aborted by the worker (pause with abort) is re-issued, as ROLL does after resume.
* **Several agents** (FlexMARL, ``TaskConfig.agents``): turn k is ``agents[k % len(agents)]``'s.
  Placement is asked for a worker of that agent (``AssignRequest.agent``); a worker of another agent
  fails the trajectory rather than mixing policies. Each turn records the agent of the worker that
  served it (``Turn.agent``; its tokens carry that worker's version), and the finished trajectory is
  stored once per agent, in that agent's experience table: ``<id>@<agent>`` in group
  ``<group>@<agent>``, holding only that agent's turns, with the trajectory's reward and status
  (an agent with no turn in it still gets the record, so every table's group completes).
* **Nothing is lost**: every admitted trajectory ends in exactly one of completed / failed /
  aborted and is put to the buffer (put is retried until the buffer takes it; until then it counts
  as ``unsaved``), so ``submitted == pending + in_flight + unsaved + completed + failed + aborted``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import itertools
import json
import logging
import math
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import prometheus_client as prom

from treadle import errors, metrics
from treadle.api import jobconfig
from treadle.policy import admission, preemption, registry
from treadle.policy.heddle import predictor
from treadle.services.agent import protocol as agent_protocol
from treadle.services.reward import protocol as reward_protocol
from treadle.services.scheduler import protocol
from treadle.v1 import common_pb2, placement_pb2, scheduler_pb2

log = logging.getLogger(__name__)
T = TypeVar("T")
STAGES = ("generation", "environment", "reward", "waiting")
RETRYABLE = (errors.Unavailable, TimeoutError)
REFUSED = "buffer: refused: "
LEARN_EVERY = 8
"""Completed trajectories a task's predictor collects before it re-learns (``learn`` re-sorts its window)."""
DEFAULT_LIST_LIMIT = 100
TYPICAL_TURN_WEIGHT = 0.1
"""Weight of each finished turn in the gate's running mean of turn time (preemption's progress)."""


class _Failed(Exception):
    """The trajectory cannot go on; ``str()`` is the reason stored with it."""


ENV_CALLS = ("open", "step")
"""Environment calls the scheduler retries; the ``call`` label of the env-failure counter."""


class SchedulerMetrics:
    def __init__(self, registry_: prom.CollectorRegistry) -> None:
        self.stage = prom.Histogram(
            metrics.SCHED_STAGE_SECONDS, "Seconds per stage call", ["stage"], registry=registry_,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )  # fmt: skip
        self.turns = prom.Counter(metrics.SCHED_TURNS_TOTAL, "Turns generated", ["task"], registry=registry_)
        self.trajectories = prom.Counter(
            metrics.SCHED_TRAJECTORIES_TOTAL,
            "Finished trajectories by status",
            ["task", "status"],
            registry=registry_,
        )
        self.inflight = prom.Gauge(metrics.SCHED_INFLIGHT, "Trajectories in flight", registry=registry_)
        self.pending = prom.Gauge(
            metrics.SCHED_PENDING, "Trajectories waiting for admission", registry=registry_
        )
        self.env_failures = prom.Counter(
            metrics.SCHED_ENV_FAILURES_TOTAL,
            "Failed environment calls, by call",
            ["call"],
            registry=registry_,
        )
        for call in ENV_CALLS:  # series exist at 0 before the first failure, so dashboards show a flat line
            self.env_failures.labels(call)
        self.env_servers = prom.Gauge(
            metrics.SCHED_ENV_SERVERS, "Environment servers new sessions are opened on", registry=registry_
        )
        self.reward_seconds = prom.Histogram(
            metrics.SCHED_REWARD_SECONDS, "Reward gateway latency", registry=registry_,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30),
        )  # fmt: skip
        self.version = prom.Gauge(metrics.SCHED_POLICY_VERSION, "Policy version served", registry=registry_)
        self.prediction_error = prom.Histogram(
            metrics.SCHED_PREDICTION_ERROR_TOKENS,
            "|predicted - actual| remaining output tokens of a completed trajectory, per prediction, by the"
            " steps done when it was made (observed at the finish, when the actual is known)",
            ["steps_done"], registry=registry_,
            buckets=(16, 64, 256, 1024, 4096, 16384, 65536),
        )  # fmt: skip
        self.preemptions = prom.Counter(
            metrics.SCHED_PREEMPTIONS_TOTAL,
            "Running generations aborted and re-queued for a higher-ranked waiting turn",
            registry=registry_,
        )
        # Children resolved once per label values: labels() locks and hashes on every call, and these
        # run several times a turn. The label values are bounded (stages, configured tasks, statuses).
        self.stage_of = functools.cache(self.stage.labels)
        self.turns_of = functools.cache(self.turns.labels)
        self.trajectories_of = functools.cache(self.trajectories.labels)
        self.prediction_error_of = functools.cache(self.prediction_error.labels)


@dataclasses.dataclass
class _Traj:
    tid: str
    work: protocol.Work
    init_version: int
    task: asyncio.Task[None] | None = None
    worker: placement_pb2.Assignment | None = None
    abort_reason: str = ""
    turns: list[common_pb2.Turn] = dataclasses.field(default_factory=list)
    stage: dict[str, float] = dataclasses.field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    started: float = 0.0
    seq: int = 0
    """Admission order (the FIFO tie-break of the ranking)."""
    tokens_so_far: int = 0
    step_tokens: list[int] = dataclasses.field(default_factory=list)
    predicted_remaining: float = 0.0
    predictions: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    """(tokens so far, predicted remaining) of every prediction, scored when the trajectory completes."""
    preemptions: int = 0
    placed: asyncio.Task[None] | None = None
    """Batch placement of its admission round; its first turn waits for it."""
    releasing: asyncio.Task[None] | None = None
    """Placement release of its last turn, in flight during the tool call; the next turn waits for it."""

    def released(self, task: asyncio.Task[None]) -> None:
        """Done callback of ``releasing``: forget it once it succeeded, so the finished task (its
        coroutine, context and request) is freed now, not held through the tool call, where every
        young GC collection walked it. A failed one stays, for the next turn to raise."""
        if self.releasing is task and not task.cancelled() and task.exception() is None:
            self.releasing = None


@dataclasses.dataclass
class _TaskCounts:
    submitted: int = 0
    completed: int = 0
    failed: int = 0
    aborted: int = 0
    reward_sum: float = 0.0


class Gate:
    """Bounds concurrent generations, holds turns while suspended, and orders the waiting ones.

    Slots are counted per ``key``: one key ("") for the whole scheduler by default, or the worker
    id (``Settings.worker_slots``), when each worker has its own queue, as in Heddle where
    progressive priority reorders every rollout worker's pending queue.

    With ``preempt`` set (a policy in ``registry.PREEMPTIVE_SCHEDULING``), a waiting turn that
    outranks a running one of the same key while its slots are taken has the running one preempted
    (``preemption.victims``): ``preempt(tid)`` ABORTs it on its worker, its generation comes back
    aborted, its slot is released and it queues again with its turn. Only turns that have run at
    most ``max_progress`` of a typical turn (the running mean of the turns that finished here, by
    ``clock``) are victims: the aborted turn's tokens are thrown away, so that bounds the waste.
    """

    def __init__(
        self,
        limit: int,
        policy: registry.SchedulingPolicy,
        *,
        preempt: Callable[[str], None] | None = None,
        margin: float = 0.0,
        max_progress: float = math.inf,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not max_progress >= 0:
            raise errors.SpecError("must be >= 0", field="preemption_max_progress", value=max_progress)
        self.limit = limit
        self.policy = policy
        self.preempt = preempt
        self.margin = margin
        self.max_progress = max_progress
        self.clock = clock
        self._started: dict[str, float] = {}
        self._typical_turn_s = 0.0
        """Exponential mean of finished (not preempted) turns' slot time; 0 until one finishes."""
        self.suspended = False
        self._seq = itertools.count()
        self._waiting: dict[str, tuple[registry.QueuedTurn, asyncio.Future[None], str]] = {}
        self._running: dict[str, tuple[registry.QueuedTurn, str]] = {}
        self._active: collections.Counter[str] = collections.Counter()
        self._stopping: set[str] = set()

    @property
    def active(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def state(self, tid: str) -> str:
        """``generating``, ``waiting`` or ``""`` (neither: in the environment, reward or admission)."""
        return "generating" if tid in self._running else "waiting" if tid in self._waiting else ""

    async def acquire(
        self, tid: str, *, turn: int, task: str, predicted_remaining: float = 0.0, tokens_so_far: int = 0,
        key: str = "",
    ) -> None:  # fmt: skip
        queued = registry.QueuedTurn(tid, next(self._seq), turn, task, predicted_remaining, tokens_so_far)
        if not self.suspended and self._active[key] < self.limit and not self._waits(key):
            self._start(tid, queued, key)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[tid] = (queued, fut, key)
        try:
            self.wake(key)
            await fut
        except asyncio.CancelledError:
            self._waiting.pop(tid, None)
            if fut.done() and not fut.cancelled():
                self.release(tid)  # the slot was granted just as we were cancelled
            raise

    def release(self, tid: str) -> None:
        if tid not in self._running:
            return  # never granted (or released already): no slot to give back
        _, key = self._running.pop(tid)
        self._active[key] -= 1
        if self._active[key] <= 0:
            del self._active[key]
        held = self.clock() - self._started.pop(tid)
        if tid not in self._stopping:  # a preempted turn's time says nothing about a whole turn's
            mean = self._typical_turn_s
            self._typical_turn_s = held if mean == 0.0 else mean + TYPICAL_TURN_WEIGHT * (held - mean)
        self._stopping.discard(tid)
        self.wake(key)

    def wake(self, key: str | None = None) -> None:
        """Grant free slots in policy order (of ``key``, or of every key) and preempt where it pays."""
        if self.suspended or not self._waiting:
            return
        keys = {k for _, _, k in self._waiting.values()} if key is None else {key}
        for k in sorted(keys):
            self._wake(k)

    def _wake(self, key: str) -> None:
        waiting = [q for q, _, k in self._waiting.values() if k == key]
        free = self.limit - self._active[key]
        if free > 0 and waiting:
            granted = set(self.policy(waiting)[:free])
            for tid in granted:
                queued, fut, _ = self._waiting.pop(tid)
                self._start(tid, queued, key)
                fut.set_result(None)
            waiting = [q for q in waiting if q.trajectory_id not in granted]
        if self.preempt is None or not waiting:
            return
        running = [q for q, k in self._running.values() if k == key]
        stopping = {tid for tid in self._stopping if self._running[tid][1] == key}
        progress = {}
        if self._typical_turn_s > 0:
            now = self.clock()
            progress = {q.trajectory_id: (now - self._started[q.trajectory_id]) / self._typical_turn_s
                        for q in running}  # fmt: skip
        for tid in preemption.victims(
            running, waiting, slots=self.limit, stopping=stopping, margin=self.margin, progress=progress,
            max_progress=self.max_progress,
        ):  # fmt: skip
            self._stopping.add(tid)
            self.preempt(tid)

    def _start(self, tid: str, queued: registry.QueuedTurn, key: str) -> None:
        self._started[tid] = self.clock()
        self._running[tid] = (queued, key)
        self._active[key] += 1

    def _waits(self, key: str) -> bool:
        return any(k == key for _, _, k in self._waiting.values())


class SchedulerService:
    def __init__(
        self,
        *,
        tasks: Mapping[str, jobconfig.TaskConfig],
        settings: jobconfig.Settings,
        envs: Sequence[protocol.Env],
        agent_for: Callable[[str], protocol.Agent],
        placement: protocol.Placement,
        reward: protocol.Reward,
        buffer: protocol.Buffer,
        registry_: prom.CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not envs:
            raise errors.SpecError("at least one environment server is required", field="envs")
        self.tasks = dict(tasks)
        self.settings = settings
        self.envs = list(envs)
        self.agent_for = agent_for
        self.placement = placement
        self.reward = reward
        self.buffer = buffer
        self.clock = clock
        self.limits = admission.Limits(
            alpha=settings.alpha, batch_size=settings.batch_size, max_in_flight=settings.max_in_flight
        )
        preemptive = settings.scheduling_policy in registry.PREEMPTIVE_SCHEDULING
        self.gate = Gate(
            settings.worker_slots or settings.max_concurrent_generations,
            registry.scheduling_policy(settings.scheduling_policy),
            preempt=self._preempt if preemptive else None, margin=settings.preemption_margin,
            max_progress=settings.preemption_max_progress, clock=clock,
        )  # fmt: skip
        # The group's weight estimated from the history (Bühlmann credibility), not a fixed pull to the
        # task mean that narrows the spread the presorted placement needs (heddle.predictor).
        self.models = {name: predictor.HistoryModel(shrink=None) for name in tasks}
        self._to_learn: dict[str, list[predictor.Finished]] = {name: [] for name in tasks}
        self._admitted = itertools.count()
        self._preemptions = 0
        self._background: set[asyncio.Task[Any]] = set()
        self.registry = registry_ or prom.CollectorRegistry()
        self.metrics = SchedulerMetrics(self.registry)
        self.metrics.env_servers.set(len(self.envs))
        self.version = 0
        self._pending: collections.deque[protocol.Work] = collections.deque()
        self._pending_trajectories = 0
        self._known_groups: set[str] = set()
        self._inflight: dict[str, _Traj] = {}
        self._unsaved: list[tuple[common_pb2.Trajectory, scheduler_pb2.TrajectoryResult]] = []
        self._saving = 0
        self._save_wake = asyncio.Event()
        self._saver: asyncio.Task[None] | None = None
        self._subscribers: set[asyncio.Queue[scheduler_pb2.TrajectoryResult | None]] = set()
        self._per_task = {name: _TaskCounts() for name in tasks}
        self._finished = 0
        self._turns = 0
        self._turns_by_agent: collections.Counter[str] = collections.Counter()
        self._env_retries = 0
        self._failed_by_reason: collections.Counter[str] = collections.Counter()
        self._stage_totals = dict.fromkeys(STAGES, 0.0)
        self._scoring: set[str] = set()
        self._closed = False
        self._attempts = {
            "environment": settings.env_attempts,
            "reward": settings.reward_attempts,
            "generation": settings.generation_attempts,
        }
        """Calls per stage before a trajectory fails; built once, not in every ``_retrying`` frame (held
        across each awaited call, so young GC collections walked one per trajectory)."""

    # --- API ------------------------------------------------------------------------------------

    def set_envs(self, envs: Sequence[protocol.Env]) -> None:
        """Open new sessions on ``envs`` from now on (the env servers were resolved again); a session
        already open keeps the server it was opened on."""
        if not envs:
            raise errors.SpecError("at least one environment server is required", field="envs")
        self.envs = list(envs)
        self.metrics.env_servers.set(len(self.envs))

    async def submit(self, groups: Sequence[scheduler_pb2.PromptGroup]) -> scheduler_pb2.SubmitResponse:
        work = protocol.validate_groups(groups, self.tasks)
        fresh = [w for w in work if w.group_id not in self._known_groups]
        members = sum(w.task.members for w in fresh)
        if self._pending_trajectories + members > self.settings.max_pending_trajectories:
            raise errors.Overloaded(
                f"{self._pending_trajectories} trajectories pending; {members} more would exceed "
                f"max_pending_trajectories={self.settings.max_pending_trajectories}"
            )
        for w in fresh:
            self._known_groups.add(w.group_id)
            self._pending.append(w)
            self._pending_trajectories += w.task.members
            self._per_task[w.task.name].submitted += w.task.members
        self.metrics.pending.set(self._pending_trajectories)
        self._admit()
        return scheduler_pb2.SubmitResponse(accepted_groups=len(fresh), trajectories=members)

    async def commit_version(self, version: int) -> scheduler_pb2.CommitVersionResponse:
        if version < self.version:
            raise errors.Conflict(f"version {version} is older than the committed version {self.version}")
        self.version = version
        self.metrics.version.set(version)
        init = {tid: t.init_version for tid, t in self._inflight.items() if not t.abort_reason}
        stale = admission.stale_in_flight(init, version=version, alpha=self.settings.alpha)
        aborts = []
        for tid in stale:
            t = self._inflight[tid]
            t.abort_reason = f"stale: initiated at version {t.init_version}, committed {version}"
            if t.worker is not None:
                aborts.append(self.agent_for(t.worker.address).abort(tid))
            if t.task is not None:
                t.task.cancel()
        # ABORT on the workers too: cancelling the call alone leaves the engine decoding until it notices.
        await asyncio.gather(*aborts, return_exceptions=True)
        self._admit()
        return scheduler_pb2.CommitVersionResponse(version=version, aborted_trajectory_ids=stale)

    def suspend(self) -> scheduler_pb2.SchedulerStats:
        self.gate.suspended = True
        return self.stats()

    def resume(self) -> scheduler_pb2.SchedulerStats:
        self.gate.suspended = False
        self.gate.wake()
        self._admit()
        return self.stats()

    def stats(self) -> scheduler_pb2.SchedulerStats:
        out = scheduler_pb2.SchedulerStats(
            version=self.version,
            suspended=self.gate.suspended,
            submitted=sum(c.submitted for c in self._per_task.values()),
            pending=self._pending_trajectories,
            in_flight=len(self._inflight),
            completed=sum(c.completed for c in self._per_task.values()),
            failed=sum(c.failed for c in self._per_task.values()),
            aborted=sum(c.aborted for c in self._per_task.values()),
            unsaved=len(self._unsaved) + self._saving,
            turns=self._turns,
            env_retries=self._env_retries,
            failed_by_reason=dict(self._failed_by_reason),
            stage_seconds=self._stage_totals,
            preemptions=self._preemptions,
            turns_by_agent=dict(self._turns_by_agent),
        )
        for name, c in sorted(self._per_task.items()):
            done = c.completed
            out.tasks.add(
                task=name, submitted=c.submitted, completed=c.completed, failed=c.failed, aborted=c.aborted,
                mean_reward=c.reward_sum / done if done else 0.0,
            )  # fmt: skip
        return out

    def list_trajectories(self, limit: int = 0) -> scheduler_pb2.ListTrajectoriesResponse:
        """In-flight trajectories in the scheduling policy's order, with prediction and worker."""
        if limit < 0:
            raise errors.SpecError("must be >= 0", field="limit", value=limit)
        queue = {t.tid: self._queued(t) for t in self._inflight.values()}
        order = self.gate.policy(list(queue.values()))
        out = scheduler_pb2.ListTrajectoriesResponse(total=len(order))
        for rank, tid in enumerate(order[: limit or DEFAULT_LIST_LIMIT]):
            t = self._inflight[tid]
            out.trajectories.add(
                trajectory_id=tid, group_id=t.work.group_id, task=t.work.task.name, rank=rank,
                predicted_remaining=t.predicted_remaining, tokens_so_far=t.tokens_so_far, turns=len(t.turns),
                worker_id=t.worker.worker_id if t.worker else "", state=self.gate.state(tid) or "other",
                preemptions=t.preemptions,
            )  # fmt: skip
        return out

    def reward_backlog(self) -> int:
        """Trajectories waiting for or in reward scoring (the operator scales the reward gateway on it)."""
        return len(self._scoring)

    def results(self, *, max_queue: int = 100_000) -> AsyncIterator[scheduler_pb2.TrajectoryResult]:
        """Every trajectory stored from this call on; ends when the scheduler closes.

        Subscribes at the call, not at the first iteration, so nothing stored in between is missed.
        """
        queue: asyncio.Queue[scheduler_pb2.TrajectoryResult | None] = asyncio.Queue(max_queue)
        self._subscribers.add(queue)
        return self._drain(queue)

    async def _drain(
        self, queue: asyncio.Queue[scheduler_pb2.TrajectoryResult | None]
    ) -> AsyncIterator[scheduler_pb2.TrajectoryResult]:
        try:
            while (item := await queue.get()) is not None:
                yield item
        finally:
            self._subscribers.discard(queue)

    async def aclose(self) -> None:
        """Cancel in-flight work (shutdown, not abort: nothing is stored for it) and flush the saver."""
        self._closed = True
        tasks = [t.task for t in self._inflight.values() if t.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for bg in list(self._background):
            bg.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self._saver is not None:
            self._saver.cancel()
            await asyncio.gather(self._saver, return_exceptions=True)
        for q in self._subscribers:
            with contextlib.suppress(asyncio.QueueFull):
                q.put_nowait(None)

    # --- admission --------------------------------------------------------------------------------

    def _admit(self) -> None:
        if self.gate.suspended or self._closed:
            return
        admitted: list[_Traj] = []
        while self._pending:
            work = self._pending[0]
            state = admission.AdmissionState(
                version=self.version, accepted=self._finished, running=len(self._inflight) + len(admitted)
            )
            if admission.admit_groups(state, self.limits, group_size=work.task.members, pending_groups=1) < 1:
                break
            self._pending.popleft()
            self._pending_trajectories -= work.task.members
            if not admitted:
                self._learn_pending()  # admission predictions see every trajectory finished so far
            for i in range(work.task.members):
                t = _Traj(
                    tid=f"{work.group_id}-{i}", work=work, init_version=self.version, started=self.clock(),
                    seq=next(self._admitted),
                )  # fmt: skip
                self._predict(t)
                admitted.append(t)
        if admitted:
            placed = asyncio.create_task(self._place(admitted), name="place batch")
            for t in admitted:
                t.placed = placed
                self._inflight[t.tid] = t
                t.task = asyncio.create_task(self._run(t), name=f"trajectory {t.tid}")
                t.task.add_done_callback(functools.partial(self._on_done, t))
        self.metrics.pending.set(self._pending_trajectories)
        self.metrics.inflight.set(len(self._inflight))

    # --- one trajectory -------------------------------------------------------------------------

    async def _run(self, t: _Traj) -> None:
        task = t.work.task
        status, reason, reward, prompt = "completed", "", 0.0, ""
        env_reward: float | None = None
        opened = False
        try:
            obs, env = await self._open(t)
            opened = True
            prompt = obs.observation
            messages = [agent_protocol.ChatMessage(role="user", content=obs.observation)]
            if task.system_prompt:
                messages.insert(0, agent_protocol.ChatMessage(role="system", content=task.system_prompt))
            done = obs.done
            while not done and len(t.turns) < task.max_turns:
                turn = await self._turn(t, messages)
                if turn is None:
                    continue  # the worker aborted the turn (pause with abort): issue it again
                action = turn.text
                messages.append(agent_protocol.ChatMessage(role="assistant", content=action))
                step = await self._retrying(
                    t, "environment", "step", functools.partial(env.step, t.tid, action)
                )
                turn.observation = step.observation
                done = step.done
                if step.reward is not None:
                    env_reward = step.reward
                if not done:
                    messages.append(agent_protocol.ChatMessage(role="user", content=step.observation))
            await self._close_env(t, env)
            opened = False
            self._scoring.add(t.tid)
            reward = await self._score(t, obs.info, prompt, env_reward)
        except _Failed as exc:
            status, reason = "failed", str(exc)
        except asyncio.CancelledError:
            if not t.abort_reason:
                raise  # shutdown
            status, reason = "aborted", t.abort_reason
        finally:
            self._scoring.discard(t.tid)
            if opened:
                await self._close_env(t, env)
            with contextlib.suppress(asyncio.CancelledError):
                await self._released(t)  # the final release must follow the last turn's
            if t.worker is not None:
                # Forget the sticky worker and feed the task profile (auto affinity).
                with contextlib.suppress(errors.TreadleError):
                    await self.placement.release(
                        placement_pb2.ReleaseRequest(
                            trajectory_id=t.tid, task=task.name, final=True, turns=len(t.turns)
                        )
                    )
        self._finish(t, status=status, reason=reason, reward=reward, prompt=prompt)

    async def _turn(self, t: _Traj, messages: list[agent_protocol.ChatMessage]) -> common_pb2.Turn | None:
        """Generate the next turn and add it to ``t.turns``; ``None`` if the worker aborted it.

        The agent's result is dropped here rather than held by ``_run`` across the environment step:
        its token lists (about 80 ints a turn at 16 tokens) were most of what every young GC
        collection walked with 2,000 trajectories in flight.
        """
        result = await self._generate(t, messages)
        if result is None:
            return None
        task = t.work.task
        turn = common_pb2.Turn(
            prompt_token_ids=result.prompt_token_ids, output_token_ids=result.output_token_ids,
            output_logprobs=result.output_logprobs, output_versions=result.output_versions,
            text=result.text, worker_id=t.worker.worker_id if t.worker else "",
            agent=t.worker.agent if t.worker and task.agents else "",
        )  # fmt: skip
        t.turns.append(turn)
        self._turns += 1
        if turn.agent:
            self._turns_by_agent[turn.agent] += 1
        self.metrics.turns_of(task.name).inc()
        return turn

    def _on_done(self, t: _Traj, task: asyncio.Task[None]) -> None:
        """Account for a trajectory whose ``_run`` did not: aborted before it started, or a bug."""
        if t.tid not in self._inflight or self._closed:
            return
        if task.cancelled():
            if t.abort_reason:
                self._finish(t, status="aborted", reason=t.abort_reason, reward=0.0, prompt="")
            return
        exc = task.exception()
        log.error("trajectory %s: internal error", t.tid, exc_info=exc)
        self._finish(t, status="failed", reason=f"internal: {exc!r}", reward=0.0, prompt="")

    async def _open(self, t: _Traj) -> tuple[Any, protocol.Env]:
        """Open the session on the trajectory's env server (by its id's hash), moving to the next on each
        retry; each attempt picks from the servers known then (``set_envs``)."""
        task = t.work.task
        start = zlib.crc32(t.tid.encode())
        attempt = 0

        async def call() -> Any:
            nonlocal attempt
            env = self.envs[(start + attempt) % len(self.envs)]
            attempt += 1
            options = {"max_turns": task.max_turns, **(t.work.options or {})}
            return env, await env.open(env=task.env, session_id=t.tid, seed=t.work.seed, options=options)

        env, obs = await self._retrying(t, "environment", "open", call)
        return obs, env

    async def _close_env(self, t: _Traj, env: protocol.Env) -> None:
        began = self.clock()
        try:
            await env.close(t.tid)
        except errors.TreadleError as exc:
            # The trajectory is complete; a session the env server lost is reaped there by idle TTL.
            log.info("trajectory %s: env close failed: %s", t.tid, exc)
        finally:
            self._spent(t, "environment", began)

    async def _generate(
        self, t: _Traj, messages: list[agent_protocol.ChatMessage]
    ) -> agent_protocol.GenerateResult | None:
        task = t.work.task
        turn = len(t.turns)
        began = self.clock()
        await self._released(t)
        if t.placed is not None:
            await asyncio.shield(t.placed)  # the batch's placement decides where its first turn goes
            t.placed = None
        # With per-worker slots the turn is assigned first and waits in its worker's queue.
        early = await self._assign(t, turn) if self.settings.worker_slots else None
        try:
            await self.gate.acquire(
                t.tid, turn=turn, task=task.name, predicted_remaining=t.predicted_remaining,
                tokens_so_far=t.tokens_so_far, key=early.worker_id if early else "",
            )  # fmt: skip
        except BaseException:
            if early is not None:  # aborted while waiting: the assigned turn is not outstanding any more
                release = placement_pb2.ReleaseRequest(
                    trajectory_id=t.tid, worker_id=early.worker_id, task=task.name, turn_finished=True
                )
                with contextlib.suppress(errors.TreadleError):
                    await self.placement.release(release)
            raise
        self._spent(t, "waiting", began)
        began = self.clock()
        try:
            t.worker = early or await self._assign(t, turn)
            req = agent_protocol.GenerateRequest(
                trajectory_id=t.tid, turn=turn, messages=messages, max_tokens=task.max_tokens,
                temperature=task.temperature,
            )  # fmt: skip
            result: agent_protocol.GenerateResult | None = None
            agent = self.agent_for(t.worker.address)
            try:
                # A retried (trajectory, turn) joins the request already in flight on the agent.
                call = f"generate on {t.worker.worker_id}"
                generate = functools.partial(agent.generate, req)
                result = await self._retrying(t, "generation", call, generate, account=False)
            finally:
                self.gate.release(t.tid)  # the engine is done with the turn: its slot is free now
                release = placement_pb2.ReleaseRequest(
                    trajectory_id=t.tid, worker_id=t.worker.worker_id, task=task.name, turn_finished=True,
                    prompt_tokens=len(result.prompt_token_ids) if result else 0,
                    output_tokens=len(result.output_token_ids) if result else 0,
                )  # fmt: skip
                if result is not None and result.finish_reason != "abort":
                    # A step boundary: re-predict now, while the environment runs the tool call.
                    t.tokens_so_far += len(result.output_token_ids)
                    t.step_tokens.append(len(result.output_token_ids))
                    self._predict(t)
                    release.predicted_remaining = t.predicted_remaining
                    release.context_tokens = len(result.prompt_token_ids) + len(result.output_token_ids)
                # Off the critical path, as Heddle's prediction and migration run during the tool
                # call: the release (a batch policy's re-rank and migration decision) overlaps the
                # environment step, and the next turn waits for it before it is assigned.
                t.releasing = asyncio.create_task(self._release(release))
                t.releasing.add_done_callback(t.released)
        finally:
            self.gate.release(t.tid)
            self._spent(t, "generation", began)
        return None if result.finish_reason == "abort" else result

    async def _release(self, release: placement_pb2.ReleaseRequest) -> None:
        with contextlib.suppress(errors.TreadleError):
            await self.placement.release(release)

    async def _released(self, t: _Traj) -> None:
        """Wait for the previous turn's placement release (in flight during the tool call)."""
        if t.releasing is not None:
            releasing, t.releasing = t.releasing, None
            await asyncio.shield(releasing)  # a cancelled trajectory still releases its turn

    async def _assign(self, t: _Traj, turn: int) -> placement_pb2.Assignment:
        agent = t.work.task.agent_of(turn)
        try:
            assigned = await self.placement.assign(
                placement_pb2.AssignRequest(
                    trajectory_id=t.tid, task=t.work.task.name, turn=turn, agent=agent
                )
            )
        except errors.TreadleError as exc:
            raise _Failed(f"placement: assign: {exc}") from exc
        if agent and assigned.agent != agent:
            # Its tokens would come from another policy's weights and poison both tables: stop here.
            release = placement_pb2.ReleaseRequest(
                trajectory_id=t.tid, worker_id=assigned.worker_id, task=t.work.task.name, turn_finished=True
            )
            await self._release(release)
            raise _Failed(
                f"placement: assign: turn {turn} of agent {agent!r} got worker {assigned.worker_id} "
                f"of agent {assigned.agent!r}"
            )
        return assigned

    def _predict(self, t: _Traj) -> None:
        obs = predictor.Observation(
            task=t.work.task.name, group_id=_prompt_key(t.work), tokens_so_far=t.tokens_so_far,
            steps_done=len(t.step_tokens),
        )  # fmt: skip
        t.predicted_remaining = self.models[t.work.task.name].predict(obs)
        t.predictions.append((t.tokens_so_far, t.predicted_remaining))

    def _queued(self, t: _Traj) -> registry.QueuedTurn:
        return registry.QueuedTurn(
            t.tid, t.seq, len(t.turns), t.work.task.name, t.predicted_remaining, t.tokens_so_far
        )

    def _learn(self, t: _Traj) -> None:
        """Feed a completed trajectory to its task's predictor (re-learned every ``LEARN_EVERY``)."""
        name = t.work.task.name
        batch = self._to_learn[name]
        finished = predictor.Finished(
            task=name,
            group_id=_prompt_key(t.work),
            total_tokens=t.tokens_so_far,
            step_tokens=(*t.step_tokens,),
        )
        batch.append(finished)
        for steps, (so_far, predicted) in enumerate(t.predictions):
            error = abs(predicted - (t.tokens_so_far - so_far))
            self.metrics.prediction_error_of("3+" if steps >= 3 else str(steps)).observe(error)
        if len(batch) >= LEARN_EVERY or name not in self.models[name].tasks:
            self._learn_pending()

    def _learn_pending(self) -> None:
        for name, batch in self._to_learn.items():
            if batch:
                self.models[name] = predictor.learn(self.models[name], batch)
                batch.clear()

    async def _place(self, admitted: Sequence[_Traj]) -> None:
        # Per-worker slots let the DP price queuing behind them (a group is not one running batch).
        req = placement_pb2.PlaceBatchRequest(worker_slots=self.settings.worker_slots)
        for t in admitted:
            req.trajectories.add(
                trajectory_id=t.tid, task=t.work.task.name, predicted_remaining=t.predicted_remaining
            )
        try:
            await self.placement.place_batch(req)
        except errors.TreadleError as exc:
            # Not fatal: each turn is still assigned one by one (a batch policy places it then).
            log.warning("placement: place_batch of %d trajectories failed: %s", len(admitted), exc)

    def _preempt(self, tid: str) -> None:
        """ABORT ``tid``'s running generation on its worker (the gate chose it as a victim)."""
        t = self._inflight.get(tid)
        if t is None or t.worker is None:
            return
        task = asyncio.create_task(self._abort_for_preemption(t, t.worker.address))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _abort_for_preemption(self, t: _Traj, address: str) -> None:
        try:
            aborted = await self.agent_for(address).abort(t.tid)
        except errors.TreadleError as exc:
            log.info("trajectory %s: preemption abort failed: %s", t.tid, exc)
            return
        if aborted:  # false: the turn finished (or had not reached the engine) first
            t.preemptions += 1
            self._preemptions += 1
            self.metrics.preemptions.inc()

    async def _retrying(
        self, t: _Traj, stage: str, call: str, fn: Callable[[], Awaitable[T]], *, account: bool = True
    ) -> T:
        """``fn()``, retried with backoff on ``Unavailable``/timeouts; ``_Failed`` with the reason after.

        ``account`` adds the time to ``stage`` (generation is timed by its caller, placement included).
        """
        attempts = self._attempts[stage]
        delay = self.settings.backoff_s
        budget = self.settings.reward_unavailable_s if stage == "reward" else 0.0
        unavailable_since: float | None = None
        attempt = 0  # calls that count against ``attempts`` (not those waited out under ``budget``)
        while True:
            began = self.clock()
            try:
                return await fn()
            except RETRYABLE as exc:
                if stage == "environment":
                    self.metrics.env_failures.labels(call).inc()
                if budget > 0 and isinstance(exc, errors.Unavailable):
                    # A gateway scaled to zero has no endpoint until its first pod is ready (tens of
                    # seconds): wait for it up to the budget rather than for a count of attempts.
                    now = self.clock()
                    unavailable_since = began if unavailable_since is None else unavailable_since
                    if now - unavailable_since >= budget:
                        raise _Failed(
                            f"{stage}: {call}: unavailable for {now - unavailable_since:.1f}s, more than "
                            f"reward_unavailable_s={budget:g}: {exc}"
                        ) from exc
                else:
                    attempt += 1
                if attempt >= attempts:
                    raise _Failed(f"{stage}: {call} failed after {attempt} attempts: {exc}") from exc
                if stage == "environment":
                    self._env_retries += 1
            except errors.TreadleError as exc:
                if stage == "environment":
                    self.metrics.env_failures.labels(call).inc()
                raise _Failed(f"{stage}: {call}: {exc}") from exc
            finally:
                if account:
                    self._spent(t, stage, began)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.settings.max_backoff_s)

    async def _score(
        self, t: _Traj, info: Mapping[str, Any], prompt: str, env_reward: float | None = None
    ) -> float:
        """Score with the task's reward function; ``env_reward`` (the environment's own, from its last
        step) goes along as ``metadata.env_reward`` for the gateway's ``env`` function."""
        task = t.work.task
        reward_fn = task.reward_fn or str(info.get("reward_fn") or "")
        if not reward_fn:
            raise _Failed(
                f"reward: task {task.name!r} names no reward function and the environment gave none"
            )
        reference = info.get("reference")
        req = reward_protocol.ScoreRequest(
            trajectory_id=t.tid, reward_fn=reward_fn, response=t.turns[-1].text if t.turns else "",
            reference=None if reference is None else str(reference), prompt=prompt,
            metadata={"task": task.name, "turns": len(t.turns),
                      **({} if env_reward is None else {"env_reward": env_reward})},
        )  # fmt: skip
        began = self.clock()
        result = await self._retrying(t, "reward", "score", lambda: self.reward.score(req))
        self.metrics.reward_seconds.observe(self.clock() - began)
        return float(result.reward)

    def _spent(self, t: _Traj, stage: str, began: float) -> None:
        seconds = self.clock() - began
        t.stage[stage] += seconds
        self.metrics.stage_of(stage).observe(seconds)

    # --- finishing --------------------------------------------------------------------------------

    def _finish(self, t: _Traj, *, status: str, reason: str, reward: float, prompt: str) -> None:
        task = t.work.task
        versions = [v for turn in t.turns for v in turn.output_versions] or [t.init_version]
        traj = common_pb2.Trajectory(
            trajectory_id=t.tid, group_id=t.work.group_id, task=task.name, agent=task.agent, turns=t.turns,
            reward=reward, status=status, reason=reason, min_version=min(versions), max_version=max(versions),
            group_size=task.members, init_version=t.init_version, prompt=prompt,
        )  # fmt: skip
        result = scheduler_pb2.TrajectoryResult(
            trajectory_id=t.tid, group_id=t.work.group_id, task=task.name, status=status, reason=reason,
            reward=reward, turns=len(t.turns), init_version=t.init_version, min_version=min(versions),
            max_version=max(versions), output_tokens=sum(len(x.output_token_ids) for x in t.turns),
            seconds=self.clock() - t.started,
        )  # fmt: skip
        for stage, seconds in t.stage.items():
            self._stage_totals[stage] += seconds
        if status == "completed" and t.step_tokens:
            self._learn(t)
        del self._inflight[t.tid]
        self._finished += 1
        self._unsaved.append((traj, result))
        self._save_wake.set()
        if self._saver is None or self._saver.done():
            self._saver = asyncio.create_task(self._save_forever(), name="buffer saver")
        self._admit()

    async def _save_forever(self) -> None:
        """Put finished trajectories to the buffer in batches; retry until it takes them."""
        delay = self.settings.backoff_s
        while True:
            if not self._unsaved:
                self._save_wake.clear()
                await self._save_wake.wait()
            chunk = self._unsaved[: self.settings.buffer_put_max]
            del self._unsaved[: len(chunk)]
            self._saving = len(chunk)
            try:
                await self.buffer.put([r for traj, _ in chunk for r in self._tables(traj)])
            except errors.SpecError as exc:
                # The buffer refuses something in the chunk (too large, say): retrying it cannot help, so
                # put one by one and store what is refused as a failed stub that says why.
                log.warning("buffer refused a put of %d trajectories: %s", len(chunk), exc)
                again = []
                for traj, result in chunk:
                    try:
                        await self.buffer.put(self._tables(traj))
                    except errors.SpecError as refused:
                        if traj.reason.startswith(REFUSED):
                            # Even the stub is refused: count it here, since storing it cannot succeed.
                            log.error(
                                "buffer refused trajectory %s even as a stub: %s", traj.trajectory_id, refused
                            )
                            self._record(traj, result)
                        else:
                            again.append(_stub(traj, result, f"{REFUSED}{refused}"))
                        continue
                    except errors.TreadleError:
                        again.append((traj, result))
                        continue
                    self._record(traj, result)
                self._unsaved[:0] = again
                self._saving = 0
                continue
            except errors.TreadleError as exc:
                log.warning(
                    "buffer put of %d trajectories failed (retrying in %.2fs): %s", len(chunk), delay, exc
                )
                self._unsaved[:0] = chunk
                self._saving = 0
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.max_backoff_s)
                continue
            delay = self.settings.backoff_s
            self._saving = 0
            for traj, result in chunk:
                self._record(traj, result)

    def _tables(self, traj: common_pb2.Trajectory) -> list[common_pb2.Trajectory]:
        """What the buffer stores for ``traj``: itself, or one record per agent of a multi-agent task."""
        agents = self.tasks[traj.task].agents
        return [_agent_record(traj, a) for a in agents] if agents else [traj]

    def _record(self, traj: common_pb2.Trajectory, result: scheduler_pb2.TrajectoryResult) -> None:
        counts = self._per_task[traj.task]
        setattr(counts, traj.status, getattr(counts, traj.status) + 1)
        if traj.status == "completed":
            counts.reward_sum += traj.reward
        else:
            self._failed_by_reason[_reason_kind(traj.reason)] += 1
        self.metrics.trajectories_of(traj.task, traj.status).inc()
        self.metrics.inflight.set(len(self._inflight))
        for q in list(self._subscribers):
            try:
                q.put_nowait(result)
            except asyncio.QueueFull:
                # A subscriber this far behind is dropped rather than growing memory without bound.
                self._subscribers.discard(q)
                with contextlib.suppress(asyncio.QueueEmpty):
                    q.get_nowait()
                q.put_nowait(None)


def _stub(
    traj: common_pb2.Trajectory, result: scheduler_pb2.TrajectoryResult, reason: str
) -> tuple[common_pb2.Trajectory, scheduler_pb2.TrajectoryResult]:
    """``traj`` as a failed record without turns or prompt, so the buffer can take it."""
    stub = common_pb2.Trajectory()
    stub.CopyFrom(traj)
    del stub.turns[:]
    stub.prompt = ""
    stub.status, stub.reason = "failed", reason
    result.status, result.reason = "failed", reason
    return stub, result


def _agent_record(traj: common_pb2.Trajectory, agent: str) -> common_pb2.Trajectory:
    """``agent``'s row of a multi-agent trajectory: its own turns, the shared reward and status."""
    out = common_pb2.Trajectory()
    out.CopyFrom(traj)
    out.trajectory_id, out.group_id, out.agent = (
        f"{traj.trajectory_id}@{agent}",
        f"{traj.group_id}@{agent}",
        agent,
    )
    del out.turns[:]
    out.turns.extend(turn for turn in traj.turns if turn.agent == agent)
    versions = [v for turn in out.turns for v in turn.output_versions] or [traj.init_version]
    out.min_version, out.max_version = min(versions), max(versions)
    return out


def _prompt_key(work: protocol.Work) -> str:
    """The predictor's sibling key: the prompt (environment seed and options), not the group id.

    Members of one GRPO group share it, and so do the groups of later steps that sample the same
    prompt again (RL epochs revisit prompts): the history-based estimate of RhymeRL / Seer, "past
    rollouts of the same prompt", on top of the group's finished siblings.
    """
    options = json.dumps(work.options, sort_keys=True) if work.options else ""
    return f"{work.seed}:{options}"


def _reason_kind(reason: str) -> str:
    """The stats key of a reason: ``"<stage>: <call>"`` without the detail (ids, URLs, versions vary)."""
    head = reason.split(": ", 2)
    return ": ".join(head[:2]) if len(head) > 1 else reason
