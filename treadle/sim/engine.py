"""The discrete-event rollout simulator: one ``Simulator`` per run, ``run()`` returns a ``Result``.

Called by ``treadle.sim.cli`` (``treadle simulate``), ``bench/sim_*.py`` and tests. It drives the
same ``treadle.policy`` functions as the live services, chosen by the same RolloutJob fields:

* ``registry.placement_policy(spec.rollout.placementPolicy)`` (or a ``baselines`` one) for every turn,
  over pools from ``affinity.eligible_pools(affinity.resolve(task.affinity, profile), ...)``;
* ``registry.scheduling_policy(spec.rollout.schedulingPolicy)`` to order a worker's waiting turns;
* ``admission.admit_groups`` / ``admission.stale_in_flight`` with ``alpha = spec.rollout.staleness``;
* ``batching.stale_groups`` / ``batching.plan_batch`` to form each training batch;
* ``bounds.lower_bound`` for the ratio to the limit.

Loop (SimPy's shape): pop the earliest event, advance ``now``, call its handler, push what the
handler returns. Same-time events run in ``events.Kind`` order, then in push order.

Placement is exact but not O(workers) per turn: the policies in ``SHORTLIST`` depend only on the
least worker by a known key and on the previous worker, so the simulator keeps one heap per pool
and passes the policy that shortlist (a test checks the decision equals the one over all workers).
Policies not listed get every worker.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence

from treadle import errors
from treadle.policy import admission, affinity, baselines, batching, bounds, costmodel, placement, registry
from treadle.sim import cost as cost_mod
from treadle.sim import entities, events, metrics, scenario, workloads

SHORTLIST: Mapping[str, str] = {
    "sticky-least-loaded": "load",
    "least-loaded": "load",
    "pinned": "load",
    "round-robin": "assigned",
}
"""Placement policies whose decision depends only on the minimum by this key and the previous worker."""

UNBOUNDED_ALPHA = 1 << 40
"""Staleness window given to ``admission`` when a system admits on concurrency alone."""

MAX_EVENTS = 50_000_000
"""Hard cap so a mis-specified scenario cannot loop for ever."""


@dataclasses.dataclass(frozen=True)
class _Task:
    name: str
    agents: tuple[str, ...]
    eligible: Mapping[str, tuple[str, ...]]
    """Agent -> pools its turns may use (after affinity)."""
    workload: workloads.Workload
    group_size: int
    launched: int
    weight: float
    reward_kind: str
    work: str | None


class Simulator:
    """One simulated run of ``config``."""

    def __init__(self, config: scenario.RunConfig) -> None:
        self.cfg = config
        self.system = config.system
        spec = config.job.spec
        self.rng = random.Random(config.seed)
        self.queue = events.Queue()
        self.now = 0.0
        self.version = 0
        self.alpha = spec.rollout.staleness
        self.batch_size = spec.rollout.batch_size
        self.placement_name = spec.rollout.placement_policy
        self.place: registry.PlacementPolicy = baselines.placement_policy(self.placement_name)
        self.schedule: registry.SchedulingPolicy = registry.scheduling_policy(spec.rollout.scheduling_policy)

        # ----- pools and workers
        self.workers: list[entities.Worker] = []
        self.pool_workers: dict[str, list[entities.Worker]] = {}
        self.pool_meta: dict[str, tuple[str, int, str]] = {}
        width = len(str(sum(p.replicas for p in spec.pools)))
        engines: dict[tuple[str, str, int], cost_mod.Roofline] = {}
        self._pool_engines: dict[str, dict[str, tuple[cost_mod.EngineCost, int]]] = {}
        for pool in spec.pools:
            acc = costmodel.accelerator(pool.accelerator)
            shape = config.models[pool.agent]
            kv = costmodel.kv_capacity_tokens(acc, shape, tp=pool.tensor_parallel_size)
            if kv <= 0:
                raise errors.SpecError(
                    f"{shape.name} does not fit on {pool.tensor_parallel_size}x{acc.name}",
                    field=f"spec.pools.{pool.name}.tensorParallelSize",
                )
            engine_key = (acc.name, shape.name, pool.tensor_parallel_size)
            if engine_key not in engines:
                engines[engine_key] = cost_mod.Roofline(acc, shape, pool.tensor_parallel_size)
            engine = engines[engine_key]
            self._pool_engines.setdefault(pool.agent, {})[pool.name] = (engine, config.max_seqs)
            self.pool_meta[pool.name] = (pool.agent, pool.tensor_parallel_size, acc.name)
            members = []
            for _ in range(pool.replicas):
                idx = len(self.workers)
                w = entities.Worker(
                    idx=idx,
                    worker_id=f"w{idx:0{width}d}",
                    pool=pool.name,
                    engine=engine,
                    max_seqs=config.max_seqs,
                    kv_capacity=kv,
                    order=self._order,
                )
                self.workers.append(w)
                members.append(w)
            self.pool_workers[pool.name] = members
        self.by_id = {w.worker_id: w for w in self.workers}
        self._heaps: dict[str, list[tuple[tuple[object, ...], int, int]]] = {p: [] for p in self.pool_workers}
        self._stamp = [0] * len(self.workers)
        self._key_kind = SHORTLIST.get(self.placement_name)
        for w in self.workers:
            self._touch(w)

        # ----- tasks
        preferences = {p.name: p.preferred_work for p in spec.pools}
        self.tasks: list[_Task] = []
        for task in spec.tasks:
            load = config.workloads[task.name]
            work: str | None = None
            if self.system.affinity:
                profile = costmodel.TaskProfile(**workloads.mean_profile(load))
                work = affinity.resolve(task.affinity, profile, shape=config.models[task.agents[0]])
            eligible: dict[str, tuple[str, ...]] = {}
            for agent in task.agents:
                mine = {
                    p.name: preferences[p.name]
                    for p in spec.pools
                    if p.agent == agent and (not task.pools or p.name in task.pools)
                }
                if not mine:
                    raise errors.SpecError(
                        f"no pool serves agent {agent}", field=f"spec.tasks.{task.name}.agents"
                    )
                pools = affinity.eligible_pools(work, mine) if work else sorted(mine)
                eligible[agent] = tuple(pools)
            launched = task.group_size
            if self.system.redundancy and task.redundancy > 0:
                launched = math.ceil(task.group_size * (1 + task.redundancy))
            self.tasks.append(
                _Task(
                    name=task.name,
                    agents=tuple(task.agents),
                    eligible=eligible,
                    workload=load,
                    group_size=task.group_size,
                    launched=launched,
                    weight=task.weight,
                    reward_kind=load.reward_kind,
                    work=work,
                )
            )
        self._task_admitted = [0] * len(self.tasks)

        # ----- rollout state
        self.trajs: list[entities.Trajectory] = []
        self.groups: list[entities.Group] = []
        self.running = 0
        self.accepted = 0
        self.in_flight: dict[int, int] = {}
        self._buffer: dict[int, entities.Group] = {}
        self._ready_completed = 0
        self._barrier: list[int] = []
        self._active_batch = 0

        # ----- reward
        self._reward_free = [0.0] * max(0, config.reward_gpus)
        self._serverless_last = -math.inf
        self._reward_busy_s = 0.0

        # ----- trainer
        shape0 = config.models[spec.agents[0].name]
        self.shape0 = shape0
        self.pause_s, self.push_s = cost_mod.weight_sync_s(self.system.weight_sync, shape0)
        self.train_gpus = (
            sum(len(ws) * self.pool_meta[p][1] for p, ws in self.pool_workers.items())
            if self.system.colocated
            else config.training.gpus
        )
        self.train_acc = (
            costmodel.accelerator(self.pool_meta[spec.pools[0].name][2])
            if self.system.colocated
            else config.training.accelerator
        )
        self.trainer_state = "waiting"
        self.step = 0
        self.step_started = 0.0
        self.steps: list[metrics.StepRecord] = []
        self.published = 0
        """Newest version whose weights reached the store (loadable)."""
        self.trained_version = 0
        self._pending_batch: list[int] = []
        self.used: list[int] = []
        self.staleness_sum = 0
        self.max_staleness = 0
        self.aborted_stale = 0
        self.aborted_redundant = 0
        self.evicted = 0
        self.timeline = metrics.Timeline()
        self._done = False
        self._pending_step = (0.0, 0.0, 0, 0)

    # ------------------------------------------------------------------ policy adapters

    def _order(self, waiting: Sequence[entities.Request]) -> list[entities.Request]:
        """A worker's waiting turns in the order ``rollout.schedulingPolicy`` gives."""
        by_name = {}
        queue = []
        for req in waiting:
            t = self.trajs[req.traj]
            by_name[t.name] = req
            queue.append(
                registry.QueuedTurn(
                    trajectory_id=t.name, seq=req.seq, turn=t.turn, task=self.tasks[t.task].name
                )
            )
        return [by_name[name] for name in self.schedule(queue)]

    def _key(self, w: entities.Worker) -> tuple[object, ...]:
        if self._key_kind == "assigned":
            return (w.assigned, w.worker_id)
        return (w.load, w.kv_usage_seen, w.assigned, w.worker_id)

    def _touch(self, w: entities.Worker) -> None:
        """Record a change of ``w``'s placement key (load, KV usage as last reported, turns given)."""
        w.kv_usage_seen = w.kv_usage
        self._stamp[w.idx] += 1
        if self._key_kind is None:
            return
        heap = self._heaps[w.pool]
        heapq.heappush(heap, (self._key(w), self._stamp[w.idx], w.idx))
        if len(heap) > 8 * len(self.pool_workers[w.pool]) + 64:
            fresh = [(self._key(x), self._stamp[x.idx], x.idx) for x in self.pool_workers[w.pool]]
            heapq.heapify(fresh)
            self._heaps[w.pool] = fresh

    def _top(self, pool: str) -> entities.Worker | None:
        heap = self._heaps[pool]
        while heap:
            _, stamp, idx = heap[0]
            if stamp == self._stamp[idx]:
                return self.workers[idx]
            heapq.heappop(heap)
        return None

    @staticmethod
    def _state(w: entities.Worker) -> placement.WorkerState:
        return placement.WorkerState(
            worker_id=w.worker_id, pool=w.pool, load=w.load, kv_cache_usage=w.kv_usage_seen
        )

    def _choose(self, traj: entities.Trajectory, pools: tuple[str, ...]) -> entities.Worker:
        previous = self.workers[traj.worker] if traj.worker >= 0 else None
        if self._key_kind is None:
            shortlist = [w for p in pools for w in self.pool_workers[p]]
        else:
            shortlist = [w for w in (self._top(p) for p in pools) if w is not None]
            if previous is not None and previous not in shortlist:
                shortlist.append(previous)
        decision = self.place(
            [self._state(w) for w in shortlist],
            eligible_pools=pools,
            previous=previous.worker_id if previous is not None else None,
            assigned={w.worker_id: w.assigned for w in shortlist},
        )
        if decision is None:
            raise errors.Unavailable(f"no worker in pools {list(pools)} for {traj.name}")
        return self.by_id[decision.worker_id]

    # ------------------------------------------------------------------ loop

    def run(self) -> metrics.Result:
        started = time.perf_counter()
        self.queue.push(events.Event(0.0, events.Kind.ADMIT))
        handlers: dict[events.Kind, Callable[[events.Event], list[events.Event]]] = {
            events.Kind.WORKER: self._on_worker,
            events.Kind.TOOL_DONE: self._on_tool,
            events.Kind.RESET_DONE: self._on_reset,
            events.Kind.REWARD_DONE: self._on_reward,
            events.Kind.TRAIN_DONE: self._on_train_done,
            events.Kind.PUSH_DONE: self._on_push,
            events.Kind.ADMIT: self._on_admit,
            events.Kind.GET_BATCH: self._on_get_batch,
        }
        count = 0
        while self.queue and not self._done:
            ev = self.queue.pop()
            self.now = ev.time
            self.queue.push_all(handlers[ev.kind](ev))
            count += 1
            if count >= MAX_EVENTS:
                raise errors.Unavailable(
                    f"simulation exceeded {MAX_EVENTS} events (scenario {self.cfg.scenario})"
                )
        if not self._done:
            raise errors.Unavailable(
                f"simulation stalled at t={self.now:.1f}s after {len(self.steps)} of {self.cfg.steps} steps"
            )
        return self._result(count, time.perf_counter() - started)

    # ------------------------------------------------------------------ admission

    def _next_task(self) -> int:
        scores = [(self._task_admitted[i] / t.weight, i) for i, t in enumerate(self.tasks)]
        return min(scores)[1]

    def _start_group(self, task_idx: int) -> list[events.Event]:
        task = self.tasks[task_idx]
        self._task_admitted[task_idx] += 1
        gid = len(self.groups)
        group = entities.Group(
            idx=gid,
            task=task_idx,
            expected=task.group_size,
            launched=task.launched,
            init_version=self.version,
            seq=gid,
        )
        self.groups.append(group)
        out = []
        for _ in range(task.launched):
            shape = workloads.draw(task.workload, self.rng)
            idx = len(self.trajs)
            traj = entities.Trajectory(
                idx=idx,
                name=f"t{idx}",
                group=gid,
                task=task_idx,
                shape_inputs=shape.inputs,
                shape_responses=shape.responses,
                shape_tools=shape.tools,
                reset_s=shape.reset_s,
                init_version=self.version,
                started_at=self.now,
            )
            self.trajs.append(traj)
            group.members.append(idx)
            self.running += 1
            self.in_flight[idx] = self.version
            if self.system.env_interaction == "batch":
                self._active_batch += 1
            out.append(events.Event(self.now + traj.reset_s, events.Kind.RESET_DONE, idx, traj.token))
        return out

    def _on_admit(self, ev: events.Event) -> list[events.Event]:
        if self.system.mode == "async":
            return self._admit_async()
        return self._open_sync_rollout()

    def _admit_async(self) -> list[events.Event]:
        out: list[events.Event] = []
        # a system that admits on concurrency alone uses the same rule with a window too wide to bind
        alpha = self.alpha if self.system.admission == "staleness" else UNBOUNDED_ALPHA
        limits = admission.Limits(
            alpha=alpha, batch_size=self.batch_size, max_in_flight=self.cfg.max_in_flight
        )
        while True:
            task_idx = self._next_task()
            # a group is sized by the members it delivers: redundant ones are rejected when the group
            # fills, so counting them would leave room for no group at all (a stall)
            delivered = self.tasks[task_idx].group_size
            # the trainer's version (steps done), as ROLL counts groups per step: a slow weight push
            # must not hold admission back (the workers' version lags by the push)
            state = admission.AdmissionState(version=self.step, accepted=self.accepted, running=self.running)
            if admission.admit_groups(state, limits, group_size=delivered, pending_groups=1) < 1:
                break
            out += self._start_group(task_idx)
        self.timeline.record(self.now, self.running)
        return out

    def _open_sync_rollout(self) -> list[events.Event]:
        """Sync and one-off: start exactly one batch's groups, then admit nothing until it is used."""
        out: list[events.Event] = []
        collected = 0
        while collected < self.batch_size:
            task_idx = self._next_task()
            collected += self.tasks[task_idx].group_size
            out += self._start_group(task_idx)
        self.timeline.record(self.now, self.running)
        return out

    # ------------------------------------------------------------------ trajectory lifecycle

    def _alive(self, ev: events.Event) -> entities.Trajectory | None:
        traj = self.trajs[ev.subject]
        return traj if traj.token == ev.token and traj.state not in ("aborted", "done") else None

    def _on_reset(self, ev: events.Event) -> list[events.Event]:
        traj = self._alive(ev)
        if traj is None:
            return []
        if self.system.env_interaction == "batch":
            return self._at_barrier(traj, "generate")
        return self._generate(traj)

    def _generate(self, traj: entities.Trajectory) -> list[events.Event]:
        task = self.tasks[traj.task]
        agent = task.agents[traj.turn % len(task.agents)]
        worker = self._choose(traj, task.eligible[agent])
        added = traj.shape_inputs[traj.turn]
        cached = int(traj.context * task.workload.prefix_reuse) if traj.worker == worker.idx else 0
        req = entities.Request(
            traj=traj.idx,
            new_tokens=traj.context - cached + added,
            cached_tokens=cached,
            remaining=float(traj.shape_responses[traj.turn]),
            context=traj.context + added,
            seq=0,
        )
        traj.state = "generating"
        traj.worker = worker.idx
        traj.request = req
        worker.assigned += 1
        out = worker.submit(req, self.now)
        self._touch(worker)
        return out

    def _on_worker(self, ev: events.Event) -> list[events.Event]:
        worker = self.workers[ev.subject]
        if ev.token != worker.token:
            return []
        if worker.state == "paused":
            out = worker.resume(self.now)
            self._touch(worker)
            return out
        finished, out = worker.on_event(self.now)
        for req in finished:
            traj = self.trajs[req.traj]
            if traj.request is not req or traj.state != "generating":
                continue
            traj.request = None
            turn = traj.turn
            traj.context += traj.shape_inputs[turn] + traj.shape_responses[turn]
            traj.turn += 1
            if self.system.env_interaction == "batch":
                out += self._at_barrier(traj, "tool")
            else:
                traj.state = "tool"
                out.append(
                    events.Event(
                        self.now + traj.shape_tools[turn], events.Kind.TOOL_DONE, traj.idx, traj.token
                    )
                )
        self._touch(worker)
        return out

    def _on_tool(self, ev: events.Event) -> list[events.Event]:
        traj = self._alive(ev)
        if traj is None:
            return []
        if self.system.env_interaction == "batch":
            return self._at_barrier(traj, "generate" if traj.turn < traj.turns else "finish")
        if traj.turn < traj.turns:
            return self._generate(traj)
        return self._finish(traj)

    def _at_barrier(self, traj: entities.Trajectory, then: str) -> list[events.Event]:
        """Batch env interaction: wait until every active trajectory reached this point."""
        traj.state = "barrier:" + then
        self._barrier.append(traj.idx)
        return self._release_barrier()

    def _release_barrier(self) -> list[events.Event]:
        if len(self._barrier) < self._active_batch or not self._barrier:
            return []
        waiting, self._barrier = self._barrier, []
        out: list[events.Event] = []
        for idx in waiting:
            traj = self.trajs[idx]
            then = traj.state.split(":", 1)[1]
            if then == "generate":
                out += self._generate(traj)
            elif then == "tool":
                traj.state = "tool"
                out.append(
                    events.Event(
                        self.now + traj.shape_tools[traj.turn - 1], events.Kind.TOOL_DONE, idx, traj.token
                    )
                )
            else:
                self._active_batch -= 1
                out += self._finish(traj)
        return out

    def _finish(self, traj: entities.Trajectory) -> list[events.Event]:
        """The trajectory is complete: score it."""
        traj.state = "reward"
        task = self.tasks[traj.task]
        compute = self.cfg.reward.compute_s(task.reward_kind, traj.tokens)
        if self.system.reward == "local":
            gpu = min(range(len(self._reward_free)), key=lambda i: self._reward_free[i])
            start = max(self.now, self._reward_free[gpu])
            self._reward_free[gpu] = start + compute
            self._reward_busy_s += compute
            done = start + compute
        else:
            done = self.now + self.cfg.reward.overhead_s(self.rng) + compute
            if self.now - self._serverless_last > self.cfg.reward.keep_warm_s:
                done += self.cfg.reward.cold_start_s
            self._serverless_last = self.now
        return [events.Event(done, events.Kind.REWARD_DONE, traj.idx, traj.token)]

    def _on_reward(self, ev: events.Event) -> list[events.Event]:
        traj = self._alive(ev)
        if traj is None:
            return []
        traj.state = "done"
        traj.finished_at = self.now
        self._leave(traj, accepted=True)
        group = self.groups[traj.group]
        group.completed += 1
        group.terminal += 1
        out: list[events.Event] = []
        if group.completed == group.expected and group.launched > group.expected:
            siblings = [m for m in group.members if self.trajs[m].state not in ("done", "aborted")]
            self.aborted_redundant += len(siblings)
            out += self._abort(siblings)
        self._group_progress(group)
        out += self._after_terminal()
        return out

    def _leave(self, traj: entities.Trajectory, *, accepted: bool) -> None:
        """Count a trajectory out of ``running``: accepted when scored, rejected when aborted (AReaL's
        StalenessManager counts rejected rollouts out of running without accepting them)."""
        self.running -= 1
        self.accepted += int(accepted)
        self.in_flight.pop(traj.idx, None)

    def _abort(self, idxs: Sequence[int]) -> list[events.Event]:
        """Abort in-flight trajectories (staleness, redundant siblings); their work is wasted."""
        by_worker: dict[int, set[int]] = {}
        for idx in idxs:
            traj = self.trajs[idx]
            if traj.state in ("done", "aborted"):
                continue
            if traj.state.startswith("barrier:"):
                self._barrier.remove(idx)
            if self.system.env_interaction == "batch":
                self._active_batch -= 1
            if traj.request is not None:
                by_worker.setdefault(traj.worker, set()).add(idx)
                traj.request = None
            traj.state = "aborted"
            traj.token += 1
            self._leave(traj, accepted=False)
            group = self.groups[traj.group]
            group.terminal += 1
            self._group_progress(group)
        out: list[events.Event] = []
        for widx, trajs in by_worker.items():
            out += self.workers[widx].abort(trajs, self.now)
            self._touch(self.workers[widx])
        if self.system.env_interaction == "batch":
            out += self._release_barrier()
        return out

    def _group_progress(self, group: entities.Group) -> None:
        """Keep the count of completed trajectories in ready groups (cheap test before planning)."""
        if group.consumed or group.aborted or group.idx in self._buffer:
            return
        if group.completed >= group.expected or group.terminal >= group.launched:
            self._buffer[group.idx] = group
            self._ready_completed += min(group.completed, group.expected)

    def _after_terminal(self) -> list[events.Event]:
        out: list[events.Event] = []
        self.timeline.record(self.now, self.running)
        if self.system.mode == "async":
            out += self._admit_async()
        if self.trainer_state == "waiting" and self._ready_completed >= self.batch_size:
            out.append(events.Event(self.now, events.Kind.GET_BATCH))
        return out

    # ------------------------------------------------------------------ trainer

    def _batching_view(self) -> list[batching.Group]:
        out = []
        for g in self._buffer.values():
            arrived = g.expected if (g.completed >= g.expected or g.terminal >= g.launched) else g.terminal
            out.append(
                batching.Group(
                    group_id=str(g.idx),
                    task=self.tasks[g.task].name,
                    expected=g.expected,
                    seq=g.seq,
                    min_version=g.init_version,
                    arrived=min(arrived, g.expected),
                    completed=min(g.completed, g.expected),
                )
            )
        return out

    def _evict_stale(self) -> list[events.Event]:
        """RollArt's eager eviction of buffered groups older than ``version - alpha``.

        "version n" (digest §6.2 ambiguity 1) is the paper's "current agent LLM" version: the one the
        workers run (it trails the trainer by the weight push). Evicted trajectories are rejected
        after the fact, which gives their room back to admission.
        """
        view = self._batching_view()
        for gid in batching.stale_groups(view, version=self.version, alpha=self.alpha):
            group = self._buffer.pop(int(gid))
            group.aborted = True
            self._ready_completed -= min(group.completed, group.expected)
            self.evicted += group.completed
            self.accepted -= group.completed
        return self._admit_async() if self.system.mode == "async" else []

    def _on_get_batch(self, ev: events.Event) -> list[events.Event]:
        if self.trainer_state != "waiting":
            return []
        out = self._evict_stale() if self.system.per_iteration_abort else []
        view = self._batching_view()
        plan = (
            batching.plan_batch(view, batch_size=self.batch_size)
            if self._ready_completed >= self.batch_size
            else None
        )
        if plan is None:
            return out
        batch: list[int] = []
        for gid in plan:
            group = self._buffer.pop(int(gid))
            group.consumed = True
            self._ready_completed -= min(group.completed, group.expected)
            done = [m for m in group.members if self.trajs[m].state == "done"]
            batch += done[: group.expected]
        return out + self._start_step(batch)

    def _start_step(self, batch: list[int]) -> list[events.Event]:
        """The batch is formed: update weights if newer ones are published, then train."""
        self.trainer_state = "updating"
        batch_at = self.now
        for idx in batch:
            staleness = self.version - self.trajs[idx].init_version
            self.staleness_sum += staleness
            self.max_staleness = max(self.max_staleness, staleness)
        out: list[events.Event] = []
        pause = 0.0
        if self.system.mode == "async" and self.published > self.version:
            pause = self.pause_s
            out += self._commit_version(self.published, pause)
        elif self.system.mode != "async" and self.trained_version > self.version:
            pause = self.pause_s
            out += self._commit_version(self.trained_version, pause)
        self.used += batch
        tokens = sum(self.trajs[i].tokens for i in batch)
        train_at = self.now + pause
        duration = cost_mod.train_time(self.shape0, tokens=tokens, gpus=self.train_gpus, acc=self.train_acc)
        self._pending_step = (batch_at, train_at, len(batch), tokens)
        self.trainer_state = "training"
        out.append(events.Event(train_at + duration, events.Kind.TRAIN_DONE, self.step + 1))
        if self.system.mode == "one-off":
            # one-off: rollout k+1 runs under the weights at hand while training consumes batch k
            out.append(events.Event(train_at, events.Kind.ADMIT))
        return out

    def _commit_version(self, version: int, pause: float) -> list[events.Event]:
        """Suspend, load ``version`` on every worker for ``pause`` seconds, resume (RollArt §6.2)."""
        self.version = version
        out: list[events.Event] = []
        if self.system.per_iteration_abort:
            stale = admission.stale_in_flight(
                {str(k): v for k, v in self.in_flight.items()}, version=self.version, alpha=self.alpha
            )
            if stale:
                self.aborted_stale += len(stale)
                out += self._abort([int(s) for s in stale])
            out += self._evict_stale()
        for w in self.workers:
            out += w.pause(self.now, pause, recompute=True)
            self._touch(w)
        if self.system.mode == "async":
            out += self._admit_async()
        return out

    def _on_train_done(self, ev: events.Event) -> list[events.Event]:
        batch_at, train_at, n, tokens = self._pending_step
        self.step += 1
        self.steps.append(
            metrics.StepRecord(
                step=self.step,
                started_at=self.step_started,
                batch_at=batch_at,
                train_at=train_at,
                ended_at=self.now,
                trajectories=n,
                tokens=tokens,
            )
        )
        self.trained_version = self.step
        self.step_started = self.now
        if self.step >= self.cfg.steps:
            self._done = True
            return []
        self.trainer_state = "waiting"
        out: list[events.Event] = []
        if self.system.mode == "async":
            out.append(events.Event(self.now + self.push_s, events.Kind.PUSH_DONE, self.step))
            out += self._admit_async()  # the trainer's version moved: the staleness window did too
        elif self.system.mode == "sync":
            # the new weights are broadcast before the next batch starts; the broadcast (workers
            # paused) is part of the next step's wait
            out += self._commit_version(self.trained_version, self.pause_s)
            out.append(events.Event(self.now, events.Kind.ADMIT))
        # always try: get_batch first evicts stale groups, which may free admission room
        out.append(events.Event(self.now, events.Kind.GET_BATCH))
        return out

    def _on_push(self, ev: events.Event) -> list[events.Event]:
        """Weights reached the store. A trainer blocked in get_batch lets the workers update now
        (they pull on demand, RollArt §6.3); otherwise the update waits for the next batch."""
        self.published = max(self.published, ev.subject)
        if self.trainer_state == "waiting" and self.published > self.version:
            return self._commit_version(self.published, self.pause_s)
        return []

    # ------------------------------------------------------------------ result

    def _result(self, count: int, wall: float) -> metrics.Result:
        total = self.now
        pools = []
        cost_h20_s = 0.0
        for name, ws in self.pool_workers.items():
            _, tp, acc_name = self.pool_meta[name]
            acc = costmodel.accelerator(acc_name)
            gpus = len(ws) * tp
            cost_h20_s += gpus * acc.cost * total
            pools.append(
                metrics.PoolStats(
                    name=name,
                    accelerator=acc_name,
                    gpus=gpus,
                    workers=len(ws),
                    busy_share=(sum(w.busy_s for w in ws) / (len(ws) * total)) if total > 0 and ws else 0.0,
                    prefill_tokens=sum(w.prefill_tokens for w in ws),
                    decode_tokens=round(sum(w.decode_tokens for w in ws)),
                )
            )
        if not self.system.colocated:
            cost_h20_s += self.train_gpus * self.train_acc.cost * total
        cost_h20_s += len(self._reward_free) * self.cfg.reward.judge_acc.cost * total
        chains = [self._chain(self.trajs[i]) for i in self.used]
        workers = {p: len(ws) for p, ws in self.pool_workers.items()}
        serial = math.fsum(s.ended_at - s.train_at for s in self.steps)
        parts = bounds.lower_bound(chains, workers, serial_s=serial)
        trained = len(self.used)
        return metrics.Result(
            scenario=self.cfg.scenario,
            system=self.system.name,
            steps=tuple(self.steps),
            pools=tuple(pools),
            total_s=total,
            started=len(self.trajs),
            completed=sum(1 for t in self.trajs if t.state == "done"),
            trained=trained,
            aborted_stale=self.aborted_stale,
            aborted_redundant=self.aborted_redundant,
            evicted=self.evicted,
            trained_tokens=sum(self.trajs[i].tokens for i in self.used),
            mean_staleness=self.staleness_sum / trained if trained else 0.0,
            max_staleness=self.max_staleness,
            lower_bound_s=parts["bound"],
            lower_bound_parts=parts,
            cost_h20_hours=cost_h20_s / 3600.0,
            reward_busy_share=(
                self._reward_busy_s / (len(self._reward_free) * total)
                if self._reward_free and self.system.reward == "local" and total > 0
                else 0.0
            ),
            events=count,
            wall_s=wall,
            timeline=self.timeline,
        )

    def _chain(self, traj: entities.Trajectory) -> list[bounds.Segment]:
        """The trajectory as ``bounds`` segments: latency at batch 1, work at the pool's best rate."""
        task = self.tasks[traj.task]
        segs = [bounds.Segment(wait_s=traj.reset_s)]
        context = 0
        for turn in range(traj.turns):
            agent = task.agents[turn % len(task.agents)]
            added, out = traj.shape_inputs[turn], traj.shape_responses[turn]
            cached = int(context * task.workload.prefix_reuse)
            latency: dict[str, float] = {}
            work: dict[str, float] = {}
            priced: dict[int, tuple[float, float]] = {}
            for pool, (engine, max_seqs) in self._pool_engines[agent].items():
                key = id(engine)
                if key not in priced:  # pools of one accelerator class price a turn alike
                    priced[key] = _turn_cost(engine, max_seqs, context, cached, added, out)
                latency[pool], work[pool] = priced[key]
            segs.append(bounds.Segment(latency=latency, work=work))
            segs.append(bounds.Segment(wait_s=traj.shape_tools[turn]))
            context += added + out
        return segs


def _turn_cost(
    engine: cost_mod.EngineCost, max_seqs: int, context: int, cached: int, added: int, out: int
) -> tuple[float, float]:
    """(latency alone, work share at full batch) of one turn on a worker with ``engine``."""
    new = context - cached + added
    flops = engine.prefill_flops(new, cached)
    prefill = engine.prefill_batch(flops=flops, kv_tokens=context + added, new_tokens=new)
    mean_ctx = context + added + out / 2
    alone = prefill + out * engine.decode_step(1, mean_ctx)
    # work: prefill at a large packed batch (per-step overhead and weight read amortised away)
    packed = engine.prefill_batch(
        flops=flops * max_seqs, kv_tokens=(context + added) * max_seqs, new_tokens=new * max_seqs
    )
    shared = out * engine.decode_step(max_seqs, mean_ctx * max_seqs) / max_seqs
    return alone, packed / max_seqs + shared


def run(config: scenario.RunConfig) -> metrics.Result:
    """Simulate ``config`` once."""
    return Simulator(config).run()
