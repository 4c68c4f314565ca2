"""Placement logic: worker registry and loads, per-task affinity, sticky least-loaded assignment.

Built by ``grpc_server.build_server`` and, in-process, by the scheduler benchmark and tests; the
scheduler calls ``assign`` before and ``release`` after every turn. The decisions are made by
``treadle.policy.affinity`` (which pools suit a task) and the placement policy named in the job
(``treadle.policy.registry``, default ``sticky-least-loaded`` in ``treadle.policy.placement``).

A worker's load is the larger of what it last reported (running + waiting) and the turns this
service assigned to it and has not seen released: reports lag, assignments do not. ``auto``
affinity uses the task profile measured from released turns once ``min_profile_samples``
trajectories of the task have finished, and is re-resolved whenever another one finishes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import prometheus_client as prom

from treadle import errors, metrics
from treadle.policy import affinity, heddle_live, placement, registry
from treadle.v1 import placement_pb2


@dataclasses.dataclass(frozen=True)
class TaskPlacement:
    """What placement needs of one task: its declared affinity and an optional pool restriction."""

    affinity: str = affinity.AUTO
    pools: Sequence[str] = ()


@dataclasses.dataclass
class _Profile:
    trajectories: int = 0
    turns: int = 0
    first_prompt_tokens: int = 0
    output_tokens: int = 0
    released_turns: int = 0

    def to_policy(self) -> affinity.TaskProfile:
        return affinity.TaskProfile(
            mean_turns=self.turns / self.trajectories,
            prompt_tokens=self.first_prompt_tokens / self.trajectories,
            response_tokens=self.output_tokens / max(1, self.released_turns),
        )


@dataclasses.dataclass
class _Worker:
    info: placement_pb2.Worker
    load: placement_pb2.WorkerLoad
    outstanding: int = 0
    draining: bool = False


class PlacementService:
    def __init__(
        self,
        *,
        pools: Mapping[str, str],
        tasks: Mapping[str, TaskPlacement],
        policy: str = registry.DEFAULT_PLACEMENT,
        slack: int = placement.DEFAULT_SLACK,
        min_profile_samples: int = 8,
        registry_: prom.CollectorRegistry | None = None,
    ) -> None:
        if not pools:
            raise errors.SpecError("at least one pool is required", field="pools")
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
        self._migrations = 0
        self.slack = slack
        self.min_profile_samples = min_profile_samples
        self._workers: dict[str, _Worker] = {}
        self._sticky: dict[str, str] = {}
        self._first_prompt: dict[str, int] = {}
        self._profiles: dict[str, _Profile] = {t: _Profile() for t in tasks}
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
        self._migrated = prom.Counter(
            metrics.PLACEMENT_MIGRATIONS_TOTAL,
            "Trajectories moved to another worker during a tool call (re-route + re-prefill on vLLM)",
            registry=self.registry,
        )

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
            self._workers[worker.worker_id] = _Worker(info=worker, load=load)
        else:
            known.info = worker
            known.draining = False
        return worker

    def report_load(self, load: placement_pb2.WorkerLoad) -> None:
        w = self._worker(load.worker_id, field="worker_id")
        if load.running < 0 or load.waiting < 0:
            raise errors.SpecError("must be >= 0", field="running" if load.running < 0 else "waiting")
        if not 0.0 <= load.kv_cache_usage <= 1.0:
            raise errors.SpecError("must be within [0, 1]", field="kv_cache_usage", value=load.kv_cache_usage)
        w.load = load

    def assign(self, req: placement_pb2.AssignRequest) -> placement_pb2.Assignment:
        if not req.trajectory_id:
            raise errors.SpecError("must not be empty", field="trajectory_id")
        if req.task not in self.tasks:
            raise errors.SpecError(f"unknown task; known: {sorted(self.tasks)}", field="task", value=req.task)
        work = self._work[req.task]
        eligible, states = self._candidates(req.task)
        decision = self._routed(req.trajectory_id, req.task, states, eligible) if self.batch else None
        if decision is None:
            previous = self._sticky.get(req.trajectory_id)
            decision = self.policy(states, eligible_pools=eligible, previous=previous, slack=self.slack)
        if decision is None:
            raise errors.Unavailable(f"no healthy worker in pools {eligible} for task {req.task!r} ({work})")
        w = self._workers[decision.worker_id]
        w.outstanding += 1
        self._sticky[req.trajectory_id] = decision.worker_id
        self._assigned.labels(w.info.pool, decision.reason).inc()
        self._outstanding.labels(decision.worker_id).set(w.outstanding)
        return placement_pb2.Assignment(
            worker_id=decision.worker_id,
            address=w.info.address,
            pool=w.info.pool,
            reason=decision.reason,
            work=work,
        )

    def place_batch(self, req: placement_pb2.PlaceBatchRequest) -> placement_pb2.PlaceBatchResponse:
        """Place trajectories admitted together (batch-level policies); validated all or nothing."""
        by_task: dict[str, dict[str, float]] = {}
        for i, c in enumerate(req.trajectories):
            at = f"trajectories[{i}]"
            if not c.trajectory_id:
                raise errors.SpecError("must not be empty", field=f"{at}.trajectory_id")
            if c.task not in self.tasks:
                raise errors.SpecError(
                    f"unknown task; known: {sorted(self.tasks)}", field=f"{at}.task", value=c.task
                )
            if not (c.predicted_remaining >= 0 and math.isfinite(c.predicted_remaining)):
                raise errors.SpecError(
                    "must be a finite number >= 0",
                    field=f"{at}.predicted_remaining",
                    value=c.predicted_remaining,
                )
            by_task.setdefault(c.task, {})[c.trajectory_id] = c.predicted_remaining
        if req.worker_slots < 0:
            raise errors.SpecError("must be >= 0", field="worker_slots", value=req.worker_slots)
        if not self.batch:
            return placement_pb2.PlaceBatchResponse(placed=0)
        placed = 0
        for task, new in by_task.items():
            workers = self._healthy_eligible(task)
            if workers:  # none now: each turn is placed at assign, when one may be back
                self._slots[task] = req.worker_slots
                self._live[task] = heddle_live.place(self._live[task], new, workers, slots=self._slots[task])
                placed += len(new)
        return placement_pb2.PlaceBatchResponse(placed=placed)

    def _candidates(self, task: str) -> tuple[list[str], list[placement.WorkerState]]:
        work = self._work[task]
        restrict = self.tasks[task].pools
        pools = {p: pref for p, pref in self.pools.items() if not restrict or p in restrict}
        eligible = affinity.eligible_pools(work, pools)
        states = [
            placement.WorkerState(
                worker_id=wid,
                pool=w.info.pool,
                load=max(w.outstanding, w.load.running + w.load.waiting),
                kv_cache_usage=w.load.kv_cache_usage,
                healthy=w.load.healthy and not w.draining,
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
            live = heddle_live.place(live, {tid: 0.0}, workers, slots=self._slots[task])
        live, worker, migrated = heddle_live.route(live, tid)
        self._live[task] = live
        if worker is None or not any(
            s.worker_id == worker and s.healthy and s.pool in eligible for s in states
        ):
            return None
        return placement.Decision(worker_id=worker, reason="migrated" if migrated else "routed")

    def release(self, req: placement_pb2.ReleaseRequest) -> None:
        if not req.trajectory_id:
            raise errors.SpecError("must not be empty", field="trajectory_id")
        if not (req.turn_finished or req.final):
            raise errors.SpecError("a release needs turn_finished, final or both", field="turn_finished")
        if req.prompt_tokens < 0 or req.output_tokens < 0:
            raise errors.SpecError(
                "must be >= 0", field="prompt_tokens" if req.prompt_tokens < 0 else "output_tokens"
            )
        if req.task not in self.tasks:
            raise errors.SpecError(f"unknown task; known: {sorted(self.tasks)}", field="task", value=req.task)
        profile = self._profiles[req.task]
        if req.turn_finished:
            w = self._worker(req.worker_id, field="worker_id")
            if w.outstanding > 0:
                w.outstanding -= 1
            self._outstanding.labels(req.worker_id).set(w.outstanding)
            self._first_prompt.setdefault(req.trajectory_id, req.prompt_tokens)
            profile.output_tokens += req.output_tokens
            profile.released_turns += 1
            if self.batch and req.HasField("predicted_remaining") and not req.final:
                self._step(req)
        if req.final:
            if self.batch:
                self._live[req.task] = heddle_live.finish(self._live[req.task], req.trajectory_id)
            self._sticky.pop(req.trajectory_id, None)
            first_prompt = self._first_prompt.pop(req.trajectory_id, None)
            if req.turns > 0 and first_prompt is not None:
                profile.trajectories += 1
                profile.turns += req.turns
                profile.first_prompt_tokens += first_prompt
                self._work[req.task] = self._resolve(req.task)

    def _step(self, req: placement_pb2.ReleaseRequest) -> None:
        """A step boundary under a batch-level policy: the new prediction may migrate the trajectory."""
        if not (req.predicted_remaining >= 0 and math.isfinite(req.predicted_remaining)):
            raise errors.SpecError(
                "must be a finite number >= 0", field="predicted_remaining", value=req.predicted_remaining
            )
        if req.context_tokens < 0:
            raise errors.SpecError("must be >= 0", field="context_tokens", value=req.context_tokens)
        live, move = heddle_live.on_step(
            self._live[req.task], req.trajectory_id, predicted_remaining=req.predicted_remaining,
            context_tokens=req.context_tokens, slots=self._slots[req.task],
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
            load.healthy = load.healthy and not w.draining
            out.workers.add(
                worker=w.info,
                load=load,
                outstanding=w.outstanding,
                sticky_trajectories=sticky_counts.get(wid, 0),
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
        return out

    def _worker(self, worker_id: str, *, field: str) -> _Worker:
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

    async def assign(self, req: placement_pb2.AssignRequest) -> placement_pb2.Assignment:
        return self.svc.assign(req)

    async def release(self, req: placement_pb2.ReleaseRequest) -> None:
        self.svc.release(req)

    async def place_batch(self, req: placement_pb2.PlaceBatchRequest) -> placement_pb2.PlaceBatchResponse:
        return self.svc.place_batch(req)
