"""Placement logic: worker registry and loads, per-task affinity, sticky least-loaded assignment.

Built by ``grpc_server.build_server`` and, in-process, by the scheduler benchmark and tests; the
scheduler calls ``assign`` before and ``release`` after every turn. The decisions are made by
``treadle.policy.affinity`` (which pools suit a task) and the placement policy named in the job
(``treadle.policy.registry``, default ``sticky-least-loaded`` in ``treadle.policy.placement``).

A worker's load is the larger of what it last reported (running + waiting) and the turns this
service assigned to it and has not seen released: reports lag, assignments do not. ``auto``
affinity uses the task profile measured from released turns once ``min_profile_samples``
trajectories of the task have finished, and is re-resolved whenever another one finishes.

A worker whose agent has not registered or reported for ``lost_after_s`` is *lost* (its pod was
deleted, or its agent is down): it gets no turn, weight sync neither waits for it nor tries it
(``weightsync``), and it is back as soon as its agent reports again; a replacement pod registers
under its own name and is told its agent's target version like any worker.

Multi-agent jobs (FlexMARL): ``pool_agents`` names the agent each pool serves. A turn's
``AssignRequest.agent`` restricts it to workers of that agent's pools (affinity then chooses among
those), and stickiness is per (trajectory, agent). Inter-agent rebalancing is split in two: the
synchronous half here (``plan_rebalance`` measures every agent's queue and instances and asks
``treadle.policy.flexmarl.load_balance.rebalance`` for a move; the moved workers are drained at once;
``finish_move`` re-homes a worker to the receiver's pool), the asynchronous half (waiting for the
drain, the weight swap through the worker's agent and engine) in ``rebalance.Rebalancer``.
"""

from __future__ import annotations

import collections
import functools
import time
from collections.abc import Callable, Mapping, Sequence

import prometheus_client as prom

from treadle import errors, metrics
from treadle.api import jobconfig
from treadle.policy import affinity, heddle_live, placement, registry
from treadle.policy.flexmarl import load_balance
from treadle.services.placement import moves, protocol, workers
from treadle.v1 import placement_pb2


class PlacementService(moves.Moves):
    def __init__(
        self,
        *,
        pools: Mapping[str, str],
        tasks: Mapping[str, jobconfig.TaskPlacement],
        policy: str = registry.DEFAULT_PLACEMENT,
        slack: int = placement.DEFAULT_SLACK,
        min_profile_samples: int = 8,
        pool_agents: Mapping[str, str] | None = None,
        pool_shapes: Mapping[str, str] | None = None,
        rebalance_delta: float = load_balance.DEFAULT_DELTA,
        rebalance_rule: load_balance.Rule = "per-instance",
        rebalance_step: int = 1,
        alpha: int | None = None,
        lost_after_s: float | None = None,
        registry_: prom.CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not pools:
            raise errors.SpecError("at least one pool is required", field="pools")
        for name, mapping in (("pool_agents", pool_agents or {}), ("pool_shapes", pool_shapes or {})):
            for pool in mapping:
                if pool not in pools:
                    raise errors.SpecError(f"unknown pool {pool!r}", field=f"{name}.{pool}", value=pool)
        if pool_agents and set(pool_agents) != set(pools):
            missing = sorted(set(pools) - set(pool_agents))
            raise errors.SpecError("every pool needs its agent", field="pool_agents", value=missing)
        if rebalance_delta < 0:
            raise errors.SpecError("must be >= 0", field="rebalance_delta", value=rebalance_delta)
        if rebalance_rule not in ("literal", "per-instance"):
            raise errors.SpecError(
                "must be 'literal' or 'per-instance'", field="rebalance_rule", value=rebalance_rule
            )
        self.pool_agents = dict(pool_agents or {})
        self.pool_shapes = dict(pool_shapes or {})
        self.rebalance_delta = rebalance_delta
        self.rebalance_rule: load_balance.Rule = rebalance_rule
        if rebalance_step < 0:
            raise errors.SpecError("must be >= 0", field="rebalance_step", value=rebalance_step)
        self.rebalance_step = rebalance_step
        if alpha is not None and alpha < 0:
            raise errors.SpecError("must be >= 0", field="alpha", value=alpha)
        if lost_after_s is not None and not lost_after_s > 0:
            raise errors.SpecError("must be > 0", field="lost_after_s", value=lost_after_s)
        self.lost_after_s = lost_after_s
        """A worker silent this long is lost (``None``: never, a placement whose workers do not report)."""
        self.clock = clock
        self.alpha = alpha
        """The job's staleness bound: no turn goes to a worker more than this behind its agent's target
        version (``None``: no bound, a bare placement)."""
        self._targets: dict[str, int] = {}
        """Agent ("" for a job of one) -> the version its workers should serve (weight sync)."""
        self._swapping: set[str] = set()
        """Workers in a ``SwapWeights`` fan-out now: not told their target (they are being given it)."""
        self._moves = 0
        self._moved_in: collections.Counter[str] = collections.Counter()
        self._moved_out: collections.Counter[str] = collections.Counter()
        for name, task in tasks.items():
            affinity.resolve(task.affinity, None)  # rejects an unknown declaration now
            for pool in task.pools:
                if pool not in pools:
                    raise errors.SpecError(f"unknown pool {pool!r}", field=f"tasks.{name}.pools", value=pool)
        affinity.eligible_pools(affinity.DECODE_HEAVY, pools)  # rejects an unknown pool preference now
        self.pools = dict(pools)
        self.tasks = dict(tasks)
        self.policy = registry.placement_policy(policy)
        self.batch = policy in registry.BATCH_PLACEMENT
        self._live: dict[str, heddle_live.Live] = {t: heddle_live.Live() for t in tasks}
        # Turns per worker that generate at once (per-worker gate), as the task's last PlaceBatch said.
        self._slots: dict[str, int] = {t: heddle_live.UNLIMITED for t in tasks}
        self._gate: dict[str, int] = {t: 0 for t in tasks}
        self._migrations = 0
        self.slack = slack
        self.min_profile_samples = min_profile_samples
        self._workers: dict[str, workers.Worker] = {}
        self._sticky: dict[str, str] = {}
        self._first_prompt: dict[str, int] = {}
        self._profiles: dict[str, workers.Profile] = {t: workers.Profile() for t in tasks}
        self._work: dict[str, str] = {t: self._resolve(t) for t in tasks}
        self.registry = registry_ or prom.CollectorRegistry()
        self._assigned = prom.Counter(
            metrics.PLACEMENT_ASSIGNMENTS_TOTAL, "Turns assigned, by pool and reason", ["pool", "reason"],
            registry=self.registry,
        )  # fmt: skip
        self._outstanding = prom.Gauge(
            metrics.PLACEMENT_OUTSTANDING, "Turns assigned and not released, by worker", ["worker"],
            registry=self.registry,
        )  # fmt: skip
        # Children looked up once: labels() takes a lock and hashes per call, on every assign and release.
        self._assigned_to = functools.cache(self._assigned.labels)
        self._outstanding_of = functools.cache(self._outstanding.labels)
        self._migrated = prom.Counter(
            metrics.PLACEMENT_MIGRATIONS_TOTAL,
            "Trajectories moved to another worker during a tool call (re-route + re-prefill on vLLM)",
            registry=self.registry,
        )
        self._rebalanced = prom.Counter(
            metrics.PLACEMENT_REBALANCE_MOVES_TOTAL,
            "Workers moved between agents by inter-agent rebalancing (FlexMARL), by donor and receiver",
            ["donor", "receiver"], registry=self.registry,
        )  # fmt: skip
        self._agent_queue = prom.Gauge(
            metrics.PLACEMENT_AGENT_QUEUE,
            "Turns assigned to an agent's workers and not running there, at the last rebalance poll",
            ["agent"], registry=self.registry,
        )  # fmt: skip

    def _resolve(self, task: str) -> str:
        profile = self._profiles[task]
        measured = profile.to_policy() if profile.trajectories >= self.min_profile_samples else None
        return affinity.resolve(self.tasks[task].affinity, measured)

    def register_worker(self, worker: placement_pb2.Worker) -> placement_pb2.Worker:
        if not worker.worker_id:
            raise errors.SpecError("must not be empty", field="worker_id")
        if worker.pool not in self.pools:
            raise errors.SpecError(
                f"unknown pool; known: {sorted(self.pools)}", field="pool", value=worker.pool
            )
        if not worker.address:
            raise errors.SpecError("must not be empty", field="address")
        known = self._workers.get(worker.worker_id)
        if known is None:
            load = placement_pb2.WorkerLoad(worker_id=worker.worker_id, healthy=True)
            self._workers[worker.worker_id] = workers.Worker(info=worker, load=load, seen=self.clock())
        else:
            known.info = worker
            known.draining = bool(known.moving_to)  # a worker being moved stays drained
            known.seen = self.clock()
        return worker

    def report_load(self, load: placement_pb2.WorkerLoad) -> None:
        w = self._worker(load.worker_id, field="worker_id")
        if load.running < 0 or load.waiting < 0:
            raise errors.SpecError("must be >= 0", field="running" if load.running < 0 else "waiting")
        if not 0.0 <= load.kv_cache_usage <= 1.0:
            raise errors.SpecError("must be within [0, 1]", field="kv_cache_usage", value=load.kv_cache_usage)
        w.load = load
        w.seen = self.clock()
        agent = self._agent_of(w)
        if not w.moving_to and load.policy_version > self._targets.get(agent, 0):
            # Versions only go up: another swapper moved it on (a trainer's ``EngineSwapper``), or this
            # placement restarted and forgot the target its workers were given.
            self._targets[agent] = load.policy_version

    def target_for(self, worker_id: str) -> int | None:
        """The version ``worker_id`` should serve (its agent's target); ``None`` while none is known,
        while a fan-out is giving it to the worker, or while the worker is being moved."""
        w = self._worker(worker_id, field="worker_id")
        if worker_id in self._swapping or w.moving_to:
            return None
        return self._targets.get(self._agent_of(w))

    def silent_s(self, worker_id: str) -> float:
        """Seconds since ``worker_id``'s agent last registered or reported (0 for an unknown worker)."""
        w = self._workers.get(worker_id)
        return 0.0 if w is None else max(0.0, self.clock() - w.seen)

    def lost(self, worker_id: str) -> bool:
        """``worker_id``'s agent has been silent for more than ``lost_after_s``."""
        return self.lost_after_s is not None and self.silent_s(worker_id) > self.lost_after_s

    def current(self, w: workers.Worker) -> bool:
        """``w`` serves a version within the staleness bound of its agent's target."""
        target = self._targets.get(self._agent_of(w))
        return self.alpha is None or target is None or w.load.policy_version >= target - self.alpha

    # --- weight sync (RollArt): the synchronous half; the fan-out is ``weights.WeightSync`` ------

    def agents(self) -> set[str]:
        """The agents the pools serve (one for a job of one agent, none for a bare placement)."""
        return set(self.pool_agents.values())

    def weights_agent(self, agent: str) -> str:
        """Whose weight prefix ``agent``'s versions are under: its own in a multi-agent job; none (the
        job's prefix, ``layout.agent_prefix``) in a job of one agent."""
        return agent if len(self.agents()) > 1 else ""

    def begin_swap(self, req: protocol.SwapRequest) -> tuple[str, list[placement_pb2.Worker]]:
        """Make ``req.version`` its agent's target; that agent and its workers to swap (not those being
        moved: a move loads the receiver's target itself). Conflict for a version older than the target."""
        agent = protocol.check_swap(req, self.agents())
        target = self._targets.get(agent)
        if target is not None and req.version < target:
            raise errors.Conflict(f"version {req.version} is older than agent {agent!r}'s target {target}")
        self._targets[agent] = req.version
        out = []
        for wid, w in sorted(self._workers.items()):
            if self._agent_of(w) == agent and not w.moving_to:
                self._swapping.add(wid)
                info = placement_pb2.Worker()
                info.CopyFrom(w.info)
                out.append(info)
        return agent, out

    def end_swap(self, worker_id: str, *, loaded: int | None) -> None:
        """A worker's part of a fan-out is over; it serves ``loaded`` now (``None``: it did not swap)."""
        self._swapping.discard(worker_id)
        w = self._workers.get(worker_id)
        if w is not None and loaded is not None:
            # Its last report still gives the previous version: until the next one, what it loaded.
            w.load.policy_version = loaded

    def workers_of(self, agent: str) -> list[placement_pb2.Worker]:
        """The registered workers serving ``agent`` now (a prefetch's fan-out)."""
        return [
            w.info for _, w in sorted(self._workers.items()) if self._agent_of(w) == agent and not w.moving_to
        ]

    def serving(self, worker_id: str) -> str:
        """The agent ``worker_id`` serves, or moves to while a rebalance moves it."""
        w = self._worker(worker_id, field="worker_id")
        return w.moving_to or self._agent_of(w)

    def pool_versions(self) -> dict[str, tuple[int, int, int | None]]:
        """Per pool with workers not lost: the lowest and highest version they report, and their agent's
        target."""
        out: dict[str, tuple[int, int, int | None]] = {}
        for wid, w in self._workers.items():
            if self.lost(wid):
                continue  # a deleted pod's last version is no version served
            v = w.load.policy_version
            low, high, _ = out.get(w.info.pool, (v, v, None))
            out[w.info.pool] = (min(low, v), max(high, v), self._targets.get(self._agent_of(w)))
        return out

    def assign(self, req: protocol.AssignRequest) -> protocol.Assignment:
        if not req.trajectory_id:
            raise errors.SpecError("must not be empty", field="trajectory_id")
        if req.task not in self.tasks:
            raise errors.SpecError(f"unknown task; known: {sorted(self.tasks)}", field="task", value=req.task)
        if req.agent and self.pool_agents and req.agent not in self.pool_agents.values():
            raise errors.SpecError(
                f"no pool serves this agent; pools serve {sorted(set(self.pool_agents.values()))}",
                field="agent", value=req.agent,
            )  # fmt: skip
        work = self._work[req.task]
        eligible, states = self._candidates(req.task, req.agent)
        decision = self._routed(req.trajectory_id, req.task, states, eligible) if self.batch else None
        sticky = workers.sticky_key(req.trajectory_id, req.agent)
        if decision is None:
            previous = self._sticky.get(sticky)
            decision = self.policy(states, eligible_pools=eligible, previous=previous, slack=self.slack)
        if decision is None:
            raise errors.Unavailable(f"no healthy worker in pools {eligible} for task {req.task!r} ({work})")
        w = self._workers[decision.worker_id]
        w.outstanding += 1
        self._sticky[sticky] = decision.worker_id
        self._assigned_to(w.info.pool, decision.reason).inc()
        self._outstanding_of(decision.worker_id).set(w.outstanding)
        return protocol.Assignment(
            worker_id=decision.worker_id,
            address=w.info.address,
            pool=w.info.pool,
            reason=decision.reason,
            work=work,
            agent=self.pool_agents.get(w.info.pool, ""),
        )

    def place_batch(self, req: protocol.PlaceBatchRequest) -> int:
        """Place trajectories admitted together (batch-level policies); validated all or nothing.
        Returns how many were placed (none under a per-turn policy)."""
        by_task = protocol.batch_by_task(req, self.tasks)
        if not self.batch:
            return 0
        placed = 0
        for task, new in by_task.items():
            workers = self._healthy_eligible(task)
            if workers:  # none now: each turn is placed at assign, when one may be back
                self._slots[task], self._gate[task] = req.worker_slots, req.gate
                self._live[task] = heddle_live.place(
                    self._live[task], new, workers, slots=req.worker_slots, gate=req.gate
                )
                placed += len(new)
        return placed

    def _candidates(self, task: str, agent: str = "") -> tuple[list[str], list[placement.WorkerState]]:
        work = self._work[task]
        restrict = self.tasks[task].pools
        pools = {p: pref for p, pref in self.pools.items() if not restrict or p in restrict}
        if agent and self.pool_agents:
            # The agent's own pools first: affinity then chooses among them (a turn never goes to
            # another agent's weights, whatever the work it prefers).
            pools = {p: pref for p, pref in pools.items() if self.pool_agents[p] == agent} or {
                p: pref for p, pref in self.pools.items() if self.pool_agents[p] == agent
            }
        eligible = affinity.eligible_pools(work, pools)
        states = [
            placement.WorkerState(
                worker_id=wid,
                pool=w.info.pool,
                load=workers.load(w),
                kv_cache_usage=w.load.kv_cache_usage,
                healthy=self._assignable(wid, w),
            )
            for wid, w in self._workers.items()
        ]
        return eligible, states

    def _healthy_eligible(self, task: str) -> list[str]:
        eligible, states = self._candidates(task)
        return [s.worker_id for s in states if s.healthy and s.pool in eligible]

    def _routed(
        self, tid: str, task: str, states: Sequence[placement.WorkerState], eligible: Sequence[str]
    ) -> placement.Decision | None:
        """The router's worker for this turn; ``None`` to fall back to the per-turn policy."""
        live = self._live[task]
        if live.router is None or tid not in live.router.entries:
            workers = self._healthy_eligible(task)
            if not workers:
                return None
            live = heddle_live.place(
                live, {tid: 0.0}, workers, slots=self._slots[task], gate=self._gate[task]
            )
        live, worker, migrated = heddle_live.route(live, tid)
        self._live[task] = live
        if worker is None or not any(
            s.worker_id == worker and s.healthy and s.pool in eligible for s in states
        ):
            return None
        return placement.Decision(worker_id=worker, reason="migrated" if migrated else "routed")

    def release(self, req: protocol.ReleaseRequest) -> None:
        protocol.check_release(req, self.tasks)
        profile = self._profiles[req.task]
        if req.turn_finished:
            w = self._worker(req.worker_id, field="worker_id")
            if w.outstanding > 0:
                w.outstanding -= 1
            self._outstanding_of(req.worker_id).set(w.outstanding)
            self._first_prompt.setdefault(req.trajectory_id, req.prompt_tokens)
            profile.output_tokens += req.output_tokens
            profile.released_turns += 1
            if self.batch and req.predicted_remaining is not None and not req.final:
                self._step(req)
        if req.final:
            if self.batch:
                self._live[req.task] = heddle_live.finish(self._live[req.task], req.trajectory_id)
            self._sticky.pop(req.trajectory_id, None)
            for agent in set(self.pool_agents.values()):
                self._sticky.pop(workers.sticky_key(req.trajectory_id, agent), None)
            first_prompt = self._first_prompt.pop(req.trajectory_id, None)
            if req.turns > 0 and first_prompt is not None:
                profile.trajectories += 1
                profile.turns += req.turns
                profile.first_prompt_tokens += first_prompt
                self._work[req.task] = self._resolve(req.task)

    def _step(self, req: protocol.ReleaseRequest) -> None:
        """A step boundary under a batch-level policy: the new prediction may migrate the trajectory."""
        predicted = protocol.check_step(req)
        live, move = heddle_live.on_step(
            self._live[req.task], req.trajectory_id, predicted_remaining=predicted,
            context_tokens=req.context_tokens, slots=self._slots[req.task], gate=self._gate[req.task],
        )  # fmt: skip
        self._live[req.task] = live
        if move is not None:
            self._migrations += 1
            self._migrated.inc()

    def migrate(self, from_worker_id: str) -> int:
        """Drain a worker: it takes no new turns and its sticky trajectories move on their next turn."""
        w = self._worker(from_worker_id, field="from_worker_id")
        w.draining = True
        moved = [tid for tid, wid in self._sticky.items() if wid == from_worker_id]
        for tid in moved:
            del self._sticky[tid]
        return len(moved)

    def pool_state(self) -> placement_pb2.PoolStateResponse:
        out = placement_pb2.PoolStateResponse()
        sticky_counts: dict[str, int] = {}
        for wid in self._sticky.values():
            sticky_counts[wid] = sticky_counts.get(wid, 0) + 1
        for wid, w in sorted(self._workers.items()):
            load = placement_pb2.WorkerLoad()
            load.CopyFrom(w.load)
            load.healthy = self._assignable(wid, w)
            out.workers.add(
                worker=w.info,
                load=load,
                outstanding=w.outstanding,
                sticky_trajectories=sticky_counts.get(wid, 0),
                agent=self.pool_agents.get(w.info.pool, ""),
                moving_to=w.moving_to,
            )
        for name, task in sorted(self.tasks.items()):
            p = self._profiles[name]
            n = max(1, p.trajectories)
            out.tasks.add(
                task=name, declared=task.affinity, work=self._work[name], trajectories=p.trajectories,
                mean_turns=p.turns / n, mean_prompt_tokens=p.first_prompt_tokens / n,
                mean_output_tokens=p.output_tokens / max(1, p.released_turns),
            )  # fmt: skip
        out.migrations = self._migrations
        for a in self.agent_loads():
            out.agents.add(
                agent=a.agent_id, instances=len(a.instances), queue_len=a.queue_len,
                weight_version=a.weight_version, moved_in=self._moved_in[a.agent_id],
                moved_out=self._moved_out[a.agent_id], target_version=self._targets.get(a.agent_id, 0),
            )  # fmt: skip
        out.rebalance_moves = self._moves
        return out

    def _assignable(self, wid: str, w: workers.Worker) -> bool:
        return w.load.healthy and not w.draining and self.current(w) and not self.lost(wid)

    def _worker(self, worker_id: str, *, field: str) -> workers.Worker:
        if not worker_id:
            raise errors.SpecError("must not be empty", field=field)
        w = self._workers.get(worker_id)
        if w is None:
            raise errors.NotFound(f"unknown worker {worker_id!r}")
        return w


class InProcess:
    """``PlacementService`` behind the scheduler's async ``Placement`` interface, without gRPC.

    Used where placement runs inside the scheduler's process: the scheduler benchmark and tests.
    """

    def __init__(self, svc: PlacementService) -> None:
        self.svc = svc

    async def assign(self, req: protocol.AssignRequest) -> protocol.Assignment:
        return self.svc.assign(req)

    async def release(self, req: protocol.ReleaseRequest) -> None:
        self.svc.release(req)

    async def place_batch(self, req: protocol.PlaceBatchRequest) -> int:
        return self.svc.place_batch(req)
