"""Scheduler logic: the agent loop of every trajectory, admission, suspend/resume and version commits.

Built by ``grpc_server.build_server`` (``python -m treadle.services.scheduler``), by local mode and
by the benchmark, with its dependencies injected (``protocol.Env`` / ``Agent`` / ``Reward`` /
``Placement`` / ``Buffer``). One asyncio task per trajectory (RollArt's EnvManager: each runs on its
own timeline, so a slow environment never blocks another), in ``turns.TurnLoop``::

    env.open -> [gate -> placement.assign -> agent.generate -> placement.release -> env.step]*
             -> env.close -> reward.score -> buffer.put (batched)

The service composes its parts: ``admission`` (the queue of groups), ``turns`` (the turn loop, its
``trajectory.Traj`` records and its ``gate``), ``retry`` (backoff), ``scoring`` and ``saver`` (the
reward and save stages), ``prediction``, ``stats`` and ``results``; the parts have their own unit
tests (tests/unit/dataplane/test_scheduler_{gate,turns,parts}.py). It speaks its ``protocol`` types;
``grpc_server`` converts them to and from protobuf.

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
  the prompt, ``prediction.prompt_key``), learned from the task's completed trajectories (every
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
import functools
import itertools
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

import prometheus_client as prom

from treadle import errors
from treadle.api import jobconfig
from treadle.policy import admission as admission_policy
from treadle.policy.heddle import predictor
from treadle.services.scheduler import (
    admission,
    darts,
    darts_store,
    journal,
    prediction,
    protocol,
    results,
    retry,
    saver,
    scoring,
    stats,
    trajectory,
    turns,
)
from treadle.v1 import common_pb2

DEFAULT_LIST_LIMIT = 100


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
        darts_stats: darts_store.StatsStore | None = None,
        journal_: journal.Journal | None = None,
    ) -> None:
        _check_envs(envs)
        self.tasks = dict(tasks)
        self.settings = settings
        self.placement = placement
        self.reward = reward
        self.buffer = buffer
        self.clock = clock
        self.registry = registry_ or prom.CollectorRegistry()
        self.metrics = stats.SchedulerMetrics(self.registry)
        self.metrics.env_servers.set(len(envs))
        self.tally = stats.Tally(tasks, self.metrics)
        self.version = 0
        self.progress = protocol.Progress(version=0, step=0, mean_reward=None)
        """The latest commit as the trainer described it (what the job's status shows)."""
        self.admission = admission.Admission(self.tasks, settings)
        self.predictions = prediction.Predictions(tasks, self.metrics)
        retrier = retry.Retrier(settings, self.tally, clock)
        self.rewards = scoring.RewardStage(reward, retrier)
        self.loop = turns.TurnLoop(
            settings=settings, envs=envs, agent_for=agent_for, placement=placement, retrier=retrier,
            rewards=self.rewards, predictions=self.predictions, finish=self._finish, clock=clock,
        )  # fmt: skip
        self.gate = self.loop.gate
        self.saver = saver.Saver(buffer, settings=settings, tasks=self.tasks, on_saved=self._saved)
        left_out = functools.partial(self._saved, left_out=True)
        self.darts = darts.Darts(
            self.tasks, loop=self.loop, save=self.saver.add, drop=left_out,
            store=darts_stats or darts_store.MemoryStats(), registry_=self.registry, clock=clock,
        )  # fmt: skip
        self._results = results.Results()
        self._admitted = itertools.count()
        self._completed = 0  # trainable ones: the admission window's count (a failed one frees its place)
        self.journal = journal_ or journal.MemoryJournal()
        self.groups = journal.OpenGroups(self.journal)
        self._submitting = asyncio.Lock()

    @property
    def models(self) -> dict[str, predictor.HistoryModel]:
        """Each task's trajectory-length predictor (``prediction.Predictions``)."""
        return self.predictions.models

    # --- API ------------------------------------------------------------------------------------

    def set_envs(self, envs: Sequence[protocol.Env]) -> None:
        """Open new sessions on ``envs`` from now on (the env servers were resolved again); a session
        already open keeps the server it was opened on."""
        _check_envs(envs)
        self.loop.envs = list(envs)
        self.metrics.env_servers.set(len(envs))

    def set_consumed(self, consumed: int) -> None:
        """The trainer has taken ``consumed`` completed trajectories (``Admission.consumed``)."""
        self.admission.consumed = consumed
        self._admit()

    async def submit(self, groups: Sequence[protocol.PromptGroup]) -> protocol.SubmitResult:
        """Queue the new groups of ``groups``, recorded in the journal first (``journal``)."""
        await self.darts.ready()
        async with self._submitting:  # one request between prepare and queue: no group twice
            fresh = self.admission.prepare(groups, self.darts.plan)
            await self.groups.accept(fresh, groups)
            self._queue(fresh)
            self.darts.started(fresh)
        self._admit()
        return protocol.SubmitResult(accepted_groups=len(fresh), trajectories=sum(w.members for w in fresh))

    async def recover(self) -> protocol.Recovery:
        """Go on from the journal (a restart): the committed version and the finished count, and every
        accepted group not wholly stored, queued in acceptance order. A group none of whose members
        was stored starts again whole (DARTS plans its pool anew); one partly stored starts only the
        members it still needs. Call once, before serving."""
        await self.darts.ready()
        state = await self.journal.load()
        self.version, self.progress, self._completed = state.progress.version, state.progress, state.finished
        self.metrics.version.set(self.version)
        untouched = [g for g in state.groups if not g.stored]
        whole = self.admission.prepare([g.group for g in untouched], self.darts.plan) if untouched else []
        partial, finished = self.groups.restore(state.groups, self.tasks)
        for group_id in finished:  # already whole: a resubmission of it is not run again
            self.admission.remember(group_id)
        self._queue(whole)
        self.darts.started(whole)
        self._queue(partial)
        self._admit()
        works = whole + partial
        return protocol.Recovery(self.version, groups=len(works), trajectories=sum(w.members for w in works))

    async def commit_version(
        self, version: int, *, step: int = 0, mean_reward: float | None = None
    ) -> protocol.CommitResult:
        """Make ``version`` the committed one and abort what became too stale; ``step`` and
        ``mean_reward`` (the trainer's account of it) become ``progress``."""
        if version < self.version:
            raise errors.Conflict(f"version {version} is older than the committed version {self.version}")
        self.progress = protocol.Progress.checked(version=version, step=step, mean_reward=mean_reward)
        self.version = version
        self.journal.commit(self.progress)
        self.metrics.version.set(version)
        init = {tid: t.init_version for tid, t in self.loop.inflight.items() if not t.abort_reason}
        stale = admission_policy.stale_in_flight(init, version=version, alpha=self.settings.alpha)
        aborts = []
        for tid in stale:
            reason = f"stale: initiated at version {init[tid]}, committed {version}"
            if (abort := self.loop.abort(tid, reason)) is not None:
                aborts.append(abort)
        # ABORT on the workers too: cancelling the call alone leaves the engine decoding until it notices.
        await asyncio.gather(*aborts, return_exceptions=True)
        self._admit()
        return protocol.CommitResult(version=version, aborted_trajectory_ids=tuple(stale))

    def suspend(self) -> protocol.Stats:
        self.gate.suspended = True
        return self.stats()

    def resume(self) -> protocol.Stats:
        self.gate.suspended = False
        self.gate.wake()
        self._admit()
        return self.stats()

    def stats(self) -> protocol.Stats:
        return self.tally.stats(
            version=self.version, suspended=self.gate.suspended,
            pending=self.admission.pending_trajectories, in_flight=len(self.loop.inflight),
            unsaved=self.saver.unsaved, step=self.progress.step,
        )  # fmt: skip

    def list_trajectories(self, limit: int = 0) -> protocol.Listing:
        """In-flight trajectories in the scheduling policy's order, with prediction and worker."""
        if limit < 0:
            raise errors.SpecError("must be >= 0", field="limit", value=limit)
        inflight = self.loop.inflight
        order = self.gate.policy([t.queued() for t in inflight.values()])
        return protocol.Listing(
            total=len(order),
            trajectories=tuple(
                inflight[tid].described(rank, self.gate.state(tid) or "other")
                for rank, tid in enumerate(order[: limit or DEFAULT_LIST_LIMIT])
            ),
        )

    def reward_backlog(self) -> int:
        """Trajectories waiting for or in reward scoring (the operator scales the reward gateway on it)."""
        return len(self.rewards.scoring)

    def results(self, *, max_queue: int = 100_000) -> AsyncIterator[protocol.TrajectoryResult]:
        """Every trajectory stored from this call on; ends when the scheduler closes.

        Subscribes at the call, not at the first iteration, so nothing stored in between is missed.
        """
        return self._results.subscribe(max_queue=max_queue)

    async def aclose(self) -> None:
        """Cancel in-flight work (shutdown, not abort: nothing is stored for it) and flush the saver."""
        await self.loop.aclose()
        await self.darts.aclose()
        await self.saver.aclose()
        await self.journal.aclose()
        self._results.close()

    # --- admission and finishing ------------------------------------------------------------------

    def _admit(self) -> None:
        if self.gate.suspended or self.loop.closed:
            return
        inflight = self.loop.inflight
        groups = self.admission.take(version=self.version, accepted=self._completed, running=len(inflight))
        if groups:
            self.predictions.learn_pending()  # admission predictions see every trajectory finished so far
            admitted = []
            for work in groups:
                for i in work.indices:
                    t = trajectory.Traj(
                        tid=f"{work.group_id}-{i}", work=work, init_version=self.version,
                        started=self.clock(), seq=next(self._admitted),
                    )  # fmt: skip
                    self.predictions.predict(t)
                    admitted.append(t)
            self.loop.start(admitted)
        self.metrics.pending.set(self.admission.pending_trajectories)
        self.metrics.inflight.set(len(inflight))

    def _finish(self, t: trajectory.Traj, *, status: str, reason: str, reward: float, prompt: str) -> None:
        if status == "failed" and t.restartable and self.admission.restart(t.work, t.tid, reason):
            del self.loop.inflight[t.tid]  # its session went with its env server: it runs again whole
            return self._admit()
        task = t.work.task
        versions = [v for turn in t.turns for v in turn.output_versions] or [t.init_version]
        traj = common_pb2.Trajectory(
            trajectory_id=t.tid, group_id=t.work.group_id, task=task.name, agent=task.agent, turns=t.turns,
            reward=reward, status=status, reason=reason, min_version=min(versions), max_version=max(versions),
            group_size=t.work.group_size, init_version=t.init_version, prompt=prompt,
        )  # fmt: skip
        result = protocol.TrajectoryResult(
            trajectory_id=t.tid, group_id=t.work.group_id, task=task.name, status=status, reason=reason,
            reward=reward, turns=len(t.turns), init_version=t.init_version, min_version=min(versions),
            max_version=max(versions), output_tokens=sum(len(x.output_token_ids) for x in t.turns),
            seconds=self.clock() - t.started,
        )  # fmt: skip
        for stage, seconds in t.stage.items():
            self.tally.stage_totals[stage] += seconds
        if status == "completed" and t.step_tokens:
            self.predictions.learn(t)
        del self.loop.inflight[t.tid]
        self._completed += status == "completed"
        if not self.darts.take(t, traj, result):  # a DARTS candidate waits for its group's selection
            self.saver.add(traj, result)
        self._admit()

    def _saved(
        self, traj: common_pb2.Trajectory, result: protocol.TrajectoryResult, *, left_out: bool = False
    ) -> None:
        """``traj`` is stored (``left_out``: a DARTS candidate left out of its group, counted, not stored)."""
        completed = traj.status == "completed" and not left_out
        mark = journal.LEFT_OUT if left_out else (traj.group_size if completed else journal.NOT_COMPLETED)
        self.groups.accounted(traj.group_id, traj.trajectory_id, mark)
        self.tally.record(traj, version=self.version)
        self.metrics.inflight.set(len(self.loop.inflight))
        self._results.publish(result)

    # --- the journal's groups ---------------------------------------------------------------------

    def _queue(self, works: Sequence[protocol.Work]) -> None:
        self.admission.queue(works)
        self.groups.opened(works)
        for w in works:
            self.tally.per_task[w.task.name].submitted += w.members
        self.metrics.pending.set(self.admission.pending_trajectories)


def _check_envs(envs: Sequence[protocol.Env]) -> None:
    if not envs:
        raise errors.SpecError("at least one environment server is required", field="envs")
