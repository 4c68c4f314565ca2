"""The discrete-event rollout simulator: one ``Simulator`` per run, ``run()`` returns a ``Result``.

Called by the ``rollart`` scenario kind (``treadle.sim.kinds``: ``treadle simulate``, ``bench/sim_*.py``)
and tests. It drives the same ``treadle.policy`` functions as the live services, chosen by the same
RolloutJob fields:

* ``registry.placement_policy(spec.rollout.placementPolicy)`` (or a ``baselines`` one) for every turn,
  over pools from ``affinity.eligible_pools(affinity.resolve(task.affinity, profile), ...)``;
* ``registry.scheduling_policy(spec.rollout.schedulingPolicy)`` to order a worker's waiting turns;
* ``admission.admit_groups`` / ``admission.stale_in_flight`` with ``alpha = spec.rollout.staleness``;
* ``batching.stale_groups`` / ``batching.plan_batch`` to form each training batch;
* ``bounds.lower_bound`` for the ratio to the limit.

Loop (SimPy's shape): pop the earliest event, advance ``now``, call its handler, push what the
handler returns. Same-time events run in ``events.Kind`` order, then in push order.

The run is split by concept: ``layout`` takes the job's translation (``treadle.api.jobconfig``, as
the live services do) and makes the simulator's workers, pools and tasks,
``placer`` places turns, this module admits groups and moves trajectories through their turns, and
``trainer`` (functions over the simulator's state) forms batches, trains and commits weight versions.
"""

from __future__ import annotations

import functools
import math
import random
import time
from collections.abc import Callable, Sequence

from treadle import errors
from treadle.policy import admission, bounds, costmodel, registry
from treadle.sim import cost as cost_mod
from treadle.sim import entities, events, layout, metrics, placer, scenario, trainer, workloads

UNBOUNDED_ALPHA = 1 << 40
"""Staleness window given to ``admission`` when a system admits on concurrency alone."""

MAX_EVENTS = 50_000_000
"""Hard cap so a mis-specified scenario cannot loop for ever."""


class Simulator:
    """One simulated run of ``config``."""

    def __init__(self, config: scenario.RunConfig) -> None:
        self.cfg = config
        self.system = config.system
        self.rng = random.Random(config.seed)
        self.queue = events.Queue()
        self.now = 0.0
        self.version = 0
        # Workers order their waiting turns by self.schedule (self._order) only once the run starts.
        self.layout = layout.build(config, self._order)
        settings = self.layout.config.scheduler.settings
        self.alpha = settings.alpha
        self.batch_size = settings.batch_size
        self.schedule: registry.SchedulingPolicy = registry.scheduling_policy(settings.scheduling_policy)
        self.workers = self.layout.workers
        self.tasks = self.layout.tasks
        self.placer = placer.Placer(
            self.layout.config.placement.policy, self.workers, self.layout.pool_workers
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

        # ----- trainer (its handlers are in ``trainer``)
        self.pause_s, self.push_s = cost_mod.weight_sync_s(self.system.weight_sync, self.layout.shape0)
        self.trainer_state = "waiting"
        self.step = 0
        self.step_started = 0.0
        self.steps: list[metrics.StepRecord] = []
        self.published = 0
        """Newest version whose weights reached the store (loadable)."""
        self.trained_version = 0
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

    # ------------------------------------------------------------------ loop

    def run(self) -> metrics.Result:
        started = time.perf_counter()
        self.queue.push(events.Event(0.0, events.Kind.ADMIT))
        handlers: dict[events.Kind, Callable[[events.Event], list[events.Event]]] = {
            events.Kind.WORKER: self._on_worker,
            events.Kind.TOOL_DONE: self._on_tool,
            events.Kind.RESET_DONE: self._on_reset,
            events.Kind.REWARD_DONE: self._on_reward,
            events.Kind.TRAIN_DONE: functools.partial(trainer.on_train_done, self),
            events.Kind.PUSH_DONE: functools.partial(trainer.on_push, self),
            events.Kind.ADMIT: self._on_admit,
            events.Kind.GET_BATCH: functools.partial(trainer.on_get_batch, self),
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
        worker = self.placer.choose(traj, task.eligible[agent])
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
        self.placer.touch(worker)
        return out

    def _on_worker(self, ev: events.Event) -> list[events.Event]:
        worker = self.workers[ev.subject]
        if ev.token != worker.token:
            return []
        if worker.state == "paused":
            out = worker.resume(self.now)
            self.placer.touch(worker)
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
        self.placer.touch(worker)
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
            self.placer.touch(self.workers[widx])
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

    # ------------------------------------------------------------------ result

    def _result(self, count: int, wall: float) -> metrics.Result:
        total = self.now
        pools = []
        cost_h20_s = 0.0
        for name, ws in self.layout.pool_workers.items():
            tp, acc_name = self.layout.pools[name].tp, self.layout.pools[name].accelerator
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
            cost_h20_s += self.layout.train_gpus * self.layout.train_acc.cost * total
        cost_h20_s += len(self._reward_free) * self.cfg.reward.judge_acc.cost * total
        chains = [self.layout.chain(self.trajs[i]) for i in self.used]
        workers = {p: len(ws) for p, ws in self.layout.pool_workers.items()}
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


def run(config: scenario.RunConfig) -> metrics.Result:
    """Simulate ``config`` once."""
    return Simulator(config).run()
