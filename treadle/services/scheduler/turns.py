"""The turn loop of the scheduler: one asyncio task per trajectory (RollArt's EnvManager: each runs on
its own timeline, so a slow environment never blocks another)::

    env.open -> [gate -> placement.assign -> agent.generate -> placement.release -> env.step]*
             -> env.close -> reward.score -> finish

Started by ``SchedulerService`` for each admission round; ``finish`` (the service's) is called once
per trajectory with its status. Owns the trajectories in flight and the ``gate.Gate`` their turns
pass; preemption victims chosen by the gate are ABORTed on their worker here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import zlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from treadle import errors
from treadle.api import jobconfig
from treadle.policy import registry
from treadle.services.agent import protocol as agent_protocol
from treadle.services.placement import protocol as placement_protocol
from treadle.services.scheduler import gate, prediction, protocol, retry, scoring, stats, trajectory
from treadle.v1 import common_pb2

log = logging.getLogger(__name__)
MAX_WORKER_MOVES = 2
"""Times a turn whose worker became unreachable is assigned again before its trajectory fails."""


class Finish(Protocol):
    def __call__(
        self, t: trajectory.Traj, *, status: str, reason: str, reward: float, prompt: str
    ) -> None: ...


def _unmeasured(worker: str) -> Callable[[int], None]:
    return lambda tokens: None


class TurnLoop:
    def __init__(
        self,
        *,
        settings: jobconfig.Settings,
        envs: Sequence[protocol.Env],
        agent_for: Callable[[str], protocol.Agent],
        placement: protocol.Placement,
        retrier: retry.Retrier,
        rewards: scoring.RewardStage,
        predictions: prediction.Predictions,
        finish: Finish,
        clock: Callable[[], float],
    ) -> None:
        self.settings = settings
        self.envs = list(envs)
        self.agent_for = agent_for
        self.placement = placement
        self.retrier = retrier
        self.rewards = rewards
        self.predictions = predictions
        self.tally: stats.Tally = retrier.tally
        self.finish = finish
        self.clock = clock
        preemptive = settings.scheduling_policy in registry.PREEMPTIVE_SCHEDULING
        self.gate = gate.Gate(
            settings.worker_slots or settings.max_concurrent_generations,
            registry.scheduling_policy(settings.scheduling_policy),
            preempt=self.preempt if preemptive else None, margin=settings.preemption_margin,
            max_progress=settings.preemption_max_progress, clock=clock,
        )  # fmt: skip
        self.inflight: dict[str, trajectory.Traj] = {}
        self.measure: Callable[[str], Callable[[int], None]] = _unmeasured
        """Called with the worker id as a generation starts; what it returns, with the output tokens
        (0: none) as it ends. DARTS fits its per-token latency from it (``darts.Latency``)."""
        self.closed = False
        self._background: set[asyncio.Task[Any]] = set()

    def start(self, admitted: Sequence[trajectory.Traj]) -> None:
        """Run the trajectories of one admission round, their first turns after their batch placement."""
        placed = asyncio.create_task(self._place(admitted), name="place batch")
        for t in admitted:
            t.placed = placed
            self.inflight[t.tid] = t
            t.task = asyncio.create_task(self._run(t), name=f"trajectory {t.tid}")
            t.task.add_done_callback(functools.partial(self._on_done, t))

    def abort(self, tid: str, reason: str) -> Awaitable[bool] | None:
        """Cancel ``tid`` to be stored as aborted; returns the ABORT of its worker to await, if any."""
        t = self.inflight[tid]
        t.abort_reason = reason
        if t.task is not None:
            t.task.cancel()
        return self.agent_for(t.worker.address).abort(tid) if t.worker is not None else None

    def preempt(self, tid: str) -> None:
        """ABORT ``tid``'s running generation on its worker (the gate chose it as a victim)."""
        t = self.inflight.get(tid)
        if t is None or t.worker is None:
            return
        task = asyncio.create_task(self._abort_for_preemption(t, t.worker.address))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def aclose(self) -> None:
        """Cancel in-flight work (shutdown, not abort: nothing is stored for it)."""
        self.closed = True
        tasks = [t.task for t in self.inflight.values() if t.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for bg in list(self._background):
            bg.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

    # --- one trajectory -------------------------------------------------------------------------

    async def _run(self, t: trajectory.Traj) -> None:
        task = t.work.task
        status, reason, reward_, prompt = "completed", "", 0.0, ""
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
                step = await self.retrier.call(
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
            self.rewards.scoring.add(t.tid)
            reward_ = await self.rewards.score(t, obs.info, prompt, env_reward)
        except trajectory.Failed as exc:
            status, reason, t.restartable = "failed", str(exc), exc.restartable
        except asyncio.CancelledError:
            if not t.abort_reason:
                raise  # shutdown
            status, reason = "aborted", t.abort_reason
        finally:
            self.rewards.scoring.discard(t.tid)
            if opened:
                await self._close_env(t, env)
            with contextlib.suppress(asyncio.CancelledError):
                await self._released(t)  # the final release must follow the last turn's
            if t.worker is not None:
                # Forget the sticky worker and feed the task profile (auto affinity).
                with contextlib.suppress(errors.TreadleError):
                    await self.placement.release(
                        placement_protocol.ReleaseRequest(
                            trajectory_id=t.tid, task=task.name, final=True, turns=len(t.turns)
                        )
                    )
        self.finish(t, status=status, reason=reason, reward=reward_, prompt=prompt)

    async def _turn(
        self, t: trajectory.Traj, messages: list[agent_protocol.ChatMessage]
    ) -> common_pb2.Turn | None:
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
        self.tally.turn(task.name, turn.agent)
        return turn

    def _on_done(self, t: trajectory.Traj, task: asyncio.Task[None]) -> None:
        """Account for a trajectory whose ``_run`` did not: aborted before it started, or a bug. (Its id
        may be in flight again already, run from its start: ``admission.Admission.restart``.)"""
        if self.inflight.get(t.tid) is not t or self.closed:
            return
        if task.cancelled():
            if t.abort_reason:
                self.finish(t, status="aborted", reason=t.abort_reason, reward=0.0, prompt="")
            return
        exc = task.exception()
        log.error("trajectory %s: internal error", t.tid, exc_info=exc)
        self.finish(t, status="failed", reason=f"internal: {exc!r}", reward=0.0, prompt="")

    async def _open(self, t: trajectory.Traj) -> tuple[Any, protocol.Env]:
        """Open the session on the trajectory's env server (by its id's hash), moving to the next on each
        retry; each attempt picks from the servers known then (``SchedulerService.set_envs``)."""
        task = t.work.task
        start = zlib.crc32(t.tid.encode())
        attempt = 0

        async def call() -> Any:
            nonlocal attempt
            env = self.envs[(start + attempt) % len(self.envs)]
            attempt += 1
            options = {"max_turns": task.max_turns, **(t.work.options or {})}
            try:
                return env, await env.open(env=task.env, session_id=t.tid, seed=t.work.seed, options=options)
            except errors.Conflict:
                # A session under this id that has taken steps: left by a scheduler that died running this
                # trajectory (ids are the group's members, so nothing else opens it). Its owner is gone.
                log.info("trajectory %s: closing the session an earlier scheduler left open", t.tid)
                await env.close(t.tid)
                return env, await env.open(env=task.env, session_id=t.tid, seed=t.work.seed, options=options)

        env, obs = await self.retrier.call(t, "environment", "open", call)
        return obs, env

    async def _close_env(self, t: trajectory.Traj, env: protocol.Env) -> None:
        began = self.clock()
        try:
            await env.close(t.tid)
        except errors.TreadleError as exc:
            # The trajectory is complete; a session the env server lost is reaped there by idle TTL.
            log.info("trajectory %s: env close failed: %s", t.tid, exc)
        finally:
            self.retrier.spent(t, "environment", began)

    async def _generate(
        self, t: trajectory.Traj, messages: list[agent_protocol.ChatMessage]
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
                release = placement_protocol.ReleaseRequest(
                    trajectory_id=t.tid, worker_id=early.worker_id, task=task.name, turn_finished=True
                )
                with contextlib.suppress(errors.TreadleError):
                    await self.placement.release(release)
            raise
        self.retrier.spent(t, "waiting", began)
        began = self.clock()
        try:
            t.worker = early or await self._assign(t, turn)
            req = agent_protocol.GenerateRequest(
                trajectory_id=t.tid, turn=turn, messages=messages, max_tokens=task.max_tokens,
                temperature=task.temperature, stop=list(task.stop),
            )  # fmt: skip
            result: agent_protocol.GenerateResult | None = None
            measured = self.measure(t.worker.worker_id)
            try:
                for moves in itertools.count():
                    # A retried (trajectory, turn) joins the request already in flight on the agent.
                    generate = functools.partial(self.agent_for(t.worker.address).generate, req)
                    try:
                        call = f"generate on {t.worker.worker_id}"
                        result = await self.retrier.call(t, "generation", call, generate, account=False)
                        break
                    except trajectory.Failed as exc:
                        if moves >= MAX_WORKER_MOVES or not isinstance(exc.__cause__, errors.Unavailable):
                            raise
                        # Its worker is gone (a deleted inference pod): the turn goes to another, or to
                        # the replacement once placement has one ready, instead of failing the trajectory.
                        log.warning("trajectory %s: %s; assigning the turn again", t.tid, exc)
                        gone = placement_protocol.ReleaseRequest(
                            trajectory_id=t.tid,
                            worker_id=t.worker.worker_id,
                            task=task.name,
                            turn_finished=True,
                        )
                        await self._release(gone)
                        t.worker = await self._assign(t, turn)
                        measured = self.measure(t.worker.worker_id)
            finally:
                self.gate.release(t.tid)  # the engine is done with the turn: its slot is free now
                prompt_tokens = len(result.prompt_token_ids) if result else 0
                output_tokens = len(result.output_token_ids) if result else 0
                measured(output_tokens if result is not None and result.finish_reason != "abort" else 0)
                predicted: float | None = None
                if result is not None and result.finish_reason != "abort":
                    # A step boundary: re-predict now, while the environment runs the tool call.
                    t.tokens_so_far += output_tokens
                    t.step_tokens.append(output_tokens)
                    self.predictions.predict(t)
                    predicted = t.predicted_remaining
                release = placement_protocol.ReleaseRequest(
                    trajectory_id=t.tid, worker_id=t.worker.worker_id, task=task.name, turn_finished=True,
                    prompt_tokens=prompt_tokens, output_tokens=output_tokens, predicted_remaining=predicted,
                    context_tokens=prompt_tokens + output_tokens if predicted is not None else 0,
                )  # fmt: skip
                # Off the critical path, as Heddle's prediction and migration run during the tool
                # call: the release (a batch policy's re-rank and migration decision) overlaps the
                # environment step, and the next turn waits for it before it is assigned.
                t.releasing = asyncio.create_task(self._release(release))
                t.releasing.add_done_callback(t.released)
        finally:
            self.gate.release(t.tid)
            self.retrier.spent(t, "generation", began)
        assert result is not None  # the loop above ends with a result or raises
        return None if result.finish_reason == "abort" else result

    async def _release(self, release: placement_protocol.ReleaseRequest) -> None:
        with contextlib.suppress(errors.TreadleError):
            await self.placement.release(release)

    async def _released(self, t: trajectory.Traj) -> None:
        """Wait for the previous turn's placement release (in flight during the tool call)."""
        if t.releasing is not None:
            releasing, t.releasing = t.releasing, None
            await asyncio.shield(releasing)  # a cancelled trajectory still releases its turn

    async def _assign(self, t: trajectory.Traj, turn: int) -> placement_protocol.Assignment:
        agent = t.work.task.agent_of(turn)
        request = placement_protocol.AssignRequest(
            trajectory_id=t.tid, task=t.work.task.name, turn=turn, agent=agent
        )
        assign = functools.partial(self.placement.assign, request)
        assigned = await self.retrier.call(t, "placement", "assign", assign, account=False)
        if agent and assigned.agent != agent:
            # Its tokens would come from another policy's weights and poison both tables: stop here.
            release = placement_protocol.ReleaseRequest(
                trajectory_id=t.tid, worker_id=assigned.worker_id, task=t.work.task.name, turn_finished=True
            )
            await self._release(release)
            raise trajectory.Failed(
                f"placement: assign: turn {turn} of agent {agent!r} got worker {assigned.worker_id} "
                f"of agent {assigned.agent!r}"
            )
        return assigned

    async def _place(self, admitted: Sequence[trajectory.Traj]) -> None:
        # Per-worker slots let the DP price queuing behind them (a group is not one running batch).
        candidates = tuple(
            placement_protocol.Candidate(t.tid, t.work.task.name, t.predicted_remaining) for t in admitted
        )
        req = placement_protocol.PlaceBatchRequest(
            candidates,
            worker_slots=self.settings.worker_slots,
            gate=self.settings.max_concurrent_generations,
        )
        try:
            await self.placement.place_batch(req)
        except errors.TreadleError as exc:
            # Not fatal: each turn is still assigned one by one (a batch policy places it then).
            log.warning("placement: place_batch of %d trajectories failed: %s", len(admitted), exc)

    async def _abort_for_preemption(self, t: trajectory.Traj, address: str) -> None:
        try:
            aborted = await self.agent_for(address).abort(t.tid)
        except errors.TreadleError as exc:
            log.info("trajectory %s: preemption abort failed: %s", t.tid, exc)
            return
        if aborted:  # false: the turn finished (or had not reached the engine) first
            t.preemptions += 1
            self.tally.preemptions += 1
            self.tally.metrics.preemptions.inc()
