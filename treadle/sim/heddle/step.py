"""One synchronous rollout step of one Heddle system: ``StepSim``, and ``run`` for several on one batch.

Called by the ``heddle`` scenario kind (``treadle simulate``, ``bench/sim_heddle.py``) and tests;
see the package docstring for the mechanisms it drives. Everything it reports is simulated.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence

from treadle import errors
from treadle.policy import costmodel
from treadle.policy.heddle import baselines, migration, predictor, presorted_dp, priority, router, tp_planner
from treadle.sim import cost as cost_mod
from treadle.sim import entities, events
from treadle.sim.heddle import systems, workload


@dataclasses.dataclass(slots=True)
class _Traj:
    idx: int
    name: str
    shape: workload.Shape
    turn: int = 0
    context: int = 0
    generated: int = 0
    worker: int = -1
    request: entities.Request | None = None
    submitted_at: float = 0.0
    queued_s: float = 0.0
    predicted: float = 0.0
    finished_at: float = -1.0
    migrating: int = -1
    """Target worker of a launched transfer still on the wire; -2 once it landed (the next step is
    served from the moved KV); -1 when no transfer is involved."""
    wait_migration: bool = False
    tool_done_at: float = 0.0


def degree_profile(
    cfg: systems.StepConfig, tp: int, shape: Sequence[float], mean_context: float, max_group: int
) -> tp_planner.DegreeProfile | None:
    """``t_base`` and ``I(s)`` of a TP-``tp`` worker from the roofline, the paper's profiler method.

    The running batch is capped by ``max_seqs`` and by KV room for ``mean_context`` per sequence;
    ``None`` when the model does not fit with room for one long trajectory.
    """
    kv = costmodel.kv_capacity_tokens(cfg.accelerator, cfg.model, tp=tp)
    if kv < cfg.domain.max_output_tokens + 8192:
        return None
    engine = cost_mod.Roofline(cfg.accelerator, cfg.model, tp)
    cap = max(1, min(cfg.max_seqs, int(kv // max(1.0, mean_context))))
    steps = [engine.decode_step(b, b * mean_context) for b in range(1, cap + 1)]
    if cfg.interference == "closed-form":
        table = presorted_dp.interference_from_step_times(steps, max_group=max_group)
    else:
        table = presorted_dp.interference_by_simulation(steps, shape, max_group=max_group)
    return tp_planner.DegreeProfile(tp=tp, t_base=steps[0], interference=table, step_times=tuple(steps))


class StepSim:
    """One rollout step of one system."""

    def __init__(
        self,
        cfg: systems.StepConfig,
        system: systems.System,
        batch: Sequence[workload.Shape],
        history: Sequence[workload.Shape],
    ) -> None:
        self.cfg = cfg
        self.system = system
        self.rng = random.Random(cfg.seed + 1)
        self.queue = events.Queue()
        self.now = 0.0
        self.trajs = [_Traj(i, f"t{i}", s) for i, s in enumerate(batch)]
        self.model = predictor.learn(predictor.HistoryModel(), [_finished(cfg, s) for s in history])
        self.previous_epoch = [float(s.output) for s in history]
        self._learn_buffer: list[predictor.Finished] = []
        self.scored: dict[int, tuple[list[float], list[float]]] = {}
        self.preemptions = self.migrations = self.fallbacks = 0
        self.exposed = 0.0
        self.plan_s = 0.0
        self._pending: list[migration.Migration] = []
        self._busy: set[str] = set()
        self._launched: dict[str, migration.Migration] = {}
        self._cost = migration.MigrationCost(
            mode="kv-transfer",
            kv_bytes_per_token=cfg.model.kv_bytes_per_token,
            bandwidth_bytes_per_s=costmodel.KV_LINK_GBPS / 8 * 1e9 * costmodel.KV_LINK_EFFICIENCY,
            overhead_s=costmodel.KV_MIGRATION_FIXED_S,
        )
        self.done = 0

    # ------------------------------------------------------------------ setup

    def _predict(self, t: _Traj) -> float:
        true_left = t.shape.output - t.generated
        if self.cfg.predictions == "noisy-oracle":
            sigma = self.cfg.oracle_sigma[min(t.turn, len(self.cfg.oracle_sigma) - 1)]
            value = true_left * math.exp(self.rng.gauss(-sigma * sigma / 2, sigma))
        else:
            obs = predictor.Observation(self.cfg.domain.name, str(t.shape.group), t.generated, t.turn)
            value = self.model.predict(obs)
        pred, actual = self.scored.setdefault(min(t.turn, 3), ([], []))
        pred.append(value)
        actual.append(float(true_left))
        t.predicted = value
        return value

    def _build_workers(self, predictions: Sequence[float]) -> None:
        cfg, system = self.cfg, self.system
        lengths = [max(1.0, p) for p in predictions]
        top = max(lengths)
        shape = [x / top for x in lengths]
        mean_context = workload.mean_context(cfg.domain)
        n = len(self.trajs)
        profiles: dict[int, tp_planner.DegreeProfile] = {}
        for g in cfg.degrees:
            # a worker takes at most ``max_group_share`` times its even share (by GPUs)
            p = degree_profile(
                cfg, g, shape, mean_context, min(n, math.ceil(cfg.max_group_share * n * g / cfg.gpus))
            )
            if p is not None:
                profiles[g] = p
        started = time.perf_counter()
        if system.tp == "adaptive":
            usable = [p for g, p in sorted(profiles.items()) if g <= cfg.gpus]
            sized_for = self.previous_epoch if cfg.plan_on == "previous-epoch" else lengths
            plan = tp_planner.plan(
                sized_for, gpus=cfg.gpus, profiles=usable, annealing=tp_planner.Annealing(seed=cfg.seed)
            )
            degrees = plan.degrees
        else:
            g = system.tp or cfg.baseline_tp
            if g not in profiles or cfg.gpus % g:
                raise errors.SpecError(
                    f"{cfg.model.name} does not fit TP {g} on {cfg.gpus} GPUs", field="tp", value=g
                )
            degrees = (g,) * (cfg.gpus // g)
        self.plan_s += time.perf_counter() - started
        self.degrees = tuple(degrees)
        self.workers: list[entities.Worker] = []
        self.profiles: list[presorted_dp.WorkerProfile] = []
        for i, g in enumerate(degrees):
            kv = costmodel.kv_capacity_tokens(cfg.accelerator, cfg.model, tp=g)
            w = entities.Worker(
                idx=i,
                worker_id=f"w{i:02d}",
                pool=f"tp{g}",
                engine=cost_mod.Roofline(cfg.accelerator, cfg.model, g),
                max_seqs=cfg.max_seqs,
                kv_capacity=kv,
                order=self._order,
            )
            self.workers.append(w)
            p = profiles[g]
            self.profiles.append(presorted_dp.WorkerProfile(w.worker_id, p.t_base, p.interference, tp=g))
        self.by_id = {w.worker_id: w for w in self.workers}

    def _place(self, predictions: Sequence[float]) -> None:
        self.route: router.RouterState | None = None
        if self.system.placement != "heddle":
            return
        items = [
            presorted_dp.Trajectory(t.name, max(1.0, p)) for t, p in zip(self.trajs, predictions, strict=True)
        ]
        median = statistics.median(p.predicted_length for p in items)
        started = time.perf_counter()
        placed = presorted_dp.plan(
            items, self.profiles, merge=presorted_dp.Merge(below=median, block=self.cfg.merge_block)
        )
        self.plan_s += time.perf_counter() - started
        self.route = router.from_placement(placed, {p.trajectory_id: p.predicted_length for p in items})

    # ------------------------------------------------------------------ policies

    def _order(self, waiting: Sequence[entities.Request]) -> list[entities.Request]:
        by_name: dict[str, entities.Request] = {}
        queue = []
        for req in waiting:
            t = self.trajs[req.traj]
            by_name[t.name] = req
            queue.append(baselines.Queued(t.name, req.seq, t.idx, t.generated, t.predicted))
        return [by_name[name] for name in baselines.order(queue, self.system.scheduling)]

    def _choose(self, t: _Traj) -> entities.Worker:
        placement = self.system.placement
        if placement == "heddle":
            assert self.route is not None
            return self.by_id[router.route(self.route, t.name)]
        ids = [w.worker_id for w in self.workers]
        if placement == "static":
            return self.by_id[baselines.static(t.idx, ids)]
        loads = [baselines.Load(w.worker_id, w.load) for w in self.workers]
        previous = self.workers[t.worker].worker_id if t.worker >= 0 else None
        if placement == "cache-aware":
            return self.by_id[baselines.cache_aware(loads, previous)]
        return self.by_id[baselines.least_load(loads, previous, abs_threshold=self.system.least_load_abs)]

    def _preempt(self, w: entities.Worker) -> list[events.Event]:
        """Algorithm 1 on ``w`` when requests wait: preempt running ones the waiting outrank."""
        if not self.system.preemption or not w.waiting or w.state in ("prefill", "paused"):
            return []
        running = w.running()
        if not running:
            return []

        def request(r: entities.Request) -> priority.Request:
            t = self.trajs[r.traj]
            return priority.Request(t.name, t.predicted, r.seq, t.generated)

        state = priority.WorkerQueue.of(
            [request(r) for r in running],
            [request(r) for r in w.waiting],
            slots=len(running) + len(w.pending),
        )
        actions, _ = priority.run_to_completion(state)
        victims = {int(a.preempt[1:]) for a in actions if a.preempt is not None}
        if not victims:
            return []
        self.preemptions += len(victims)
        fresh, out = w.preempt(victims, self.now)
        for req in fresh:
            self.trajs[req.traj].request = req
            self.trajs[req.traj].submitted_at = self.now
        return out

    # ------------------------------------------------------------------ lifecycle

    def _submit(self, t: _Traj) -> list[events.Event]:
        w = self._choose(t)
        added = t.shape.inputs[t.turn]
        if t.worker == w.idx:
            cached = int(t.context * self.cfg.domain.prefix_reuse)
        elif t.migrating == -2:  # the KV cache was moved here during the tool call
            cached = t.context
        else:
            cached = 0
        t.migrating = -1
        req = entities.Request(
            traj=t.idx,
            new_tokens=t.context - cached + added,
            cached_tokens=cached,
            remaining=float(t.shape.responses[t.turn]),
            context=t.context + added,
            seq=0,
        )
        t.context += added
        t.worker = w.idx
        t.request = req
        t.submitted_at = self.now
        out = w.submit(req, self.now)
        return out + self._preempt(w)

    def _on_worker(self, ev: events.Event) -> list[events.Event]:
        w = self.workers[ev.subject]
        if ev.token != w.token:
            return []
        before = {id(r) for r in w.pending}
        finished, out = w.on_event(self.now)
        for r in w.running():
            t = self.trajs[r.traj]
            if t.request is r and id(r) in before:
                t.queued_s += self.now - t.submitted_at  # admitted: its queueing for this step ended
        for req in finished:
            t = self.trajs[req.traj]
            if t.request is not req:
                continue
            out += self._step_done(t)
        return out

    def _step_done(self, t: _Traj) -> list[events.Event]:
        t.request = None
        out_tokens = t.shape.responses[t.turn]
        t.generated += out_tokens
        t.context += out_tokens
        t.turn += 1
        if t.turn >= len(t.shape.responses):
            t.finished_at = self.now
            self.done += 1
            self._learn_buffer.append(_finished(self.cfg, t.shape))
            if len(self._learn_buffer) >= 32:
                self.model = predictor.learn(self.model, self._learn_buffer)
                self._learn_buffer = []
            if self.route is not None:
                self.route = router.finish(self.route, t.name)
            return []
        tool = t.shape.tools[t.turn - 1]
        ready = self.now + tool
        if self.system.scheduling == "progressive" or self.system.placement == "heddle":
            # the predictor runs during the tool call (Heddle §4.1); a short tool exposes it
            pred = self._predict(t)
            ready = self.now + max(tool, self.cfg.domain.predict_s)
            if self.route is not None:
                self.route, move = router.on_step(
                    self.route,
                    t.name,
                    predicted_remaining=pred,
                    context_tokens=t.context,
                    in_tool_call=self.system.migration,
                    expected_tool_seconds=tool,
                    cost=self._cost,
                    predict_seconds=self.cfg.domain.predict_s,
                )
                if move is not None:
                    self.route, moves = router.take_pending(self.route)
                    self._pending += moves
                    launched = self._launch(self.now + self.cfg.domain.predict_s)
                    return [*launched, events.Event(ready, events.Kind.TOOL_DONE, t.idx)]
        return [events.Event(ready, events.Kind.TOOL_DONE, t.idx)]

    def _launch(self, at: float) -> list[events.Event]:
        """The transmission scheduler: longest first, one transfer per endpoint."""
        batch = migration.schedule_epoch(self._pending, self._busy)
        if batch is None:
            return []
        out = []
        for m in batch:
            self._pending.remove(m)
            self._busy.update((m.source, m.target))
            self._launched[m.trajectory_id] = m
            t = self.trajs[int(m.trajectory_id[1:])]
            t.migrating = self.by_id[m.target].idx
            self.migrations += 1
            out.append(events.Event(max(at, self.now) + m.move_seconds, events.Kind.MIGRATION_DONE, t.idx))
        return out

    def _on_migrated(self, ev: events.Event) -> list[events.Event]:
        t = self.trajs[ev.subject]
        m = self._launched.pop(t.name)
        self._busy.difference_update((m.source, m.target))
        t.migrating = -2
        out = self._launch(self.now)
        if t.wait_migration:
            t.wait_migration = False
            self.exposed += self.now - t.tool_done_at
            out += self._submit(t)
        return out

    def _on_tool(self, ev: events.Event) -> list[events.Event]:
        t = self.trajs[ev.subject]
        if t.migrating >= 0:  # the transfer is still on the wire: the next step waits for it
            t.wait_migration = True
            t.tool_done_at = self.now
            return []
        queued = [m for m in self._pending if m.trajectory_id == t.name]
        if queued:  # never started: re-prefill on the target instead (our choice; paper silent)
            self._pending.remove(queued[0])
            self.fallbacks += 1
        return self._submit(t)

    # ------------------------------------------------------------------ run

    def run(self) -> systems.StepResult:
        started = time.perf_counter()
        predictions = [self._predict(t) for t in self.trajs]
        self._build_workers(predictions)
        self._place(predictions)
        out: list[events.Event] = []
        for t in self.trajs:
            out += self._submit(t)
        self.queue.push_all(out)
        handlers: dict[events.Kind, Callable[[events.Event], list[events.Event]]] = {
            events.Kind.WORKER: self._on_worker,
            events.Kind.TOOL_DONE: self._on_tool,
            events.Kind.MIGRATION_DONE: self._on_migrated,
        }
        count = 0
        while self.queue:
            ev = self.queue.pop()
            self.now = ev.time
            self.queue.push_all(handlers[ev.kind](ev))
            count += 1
            if count > 20_000_000:
                raise errors.Unavailable("heddle step simulation exceeded 20M events")
        if self.done != len(self.trajs):
            raise errors.Unavailable(f"stalled: {self.done} of {len(self.trajs)} trajectories finished")
        last = max(self.trajs, key=lambda t: t.finished_at)
        acc = tuple((s, predictor.accuracy(p, a)) for s, (p, a) in sorted(self.scored.items()) if len(p) >= 2)
        return systems.StepResult(
            system=self.system.name,
            label="simulated",
            makespan_s=self.now,
            output_tokens=sum(t.shape.output for t in self.trajs),
            trajectories=len(self.trajs),
            degrees=self.degrees,
            preemptions=self.preemptions,
            migrations=self.migrations,
            migration_fallbacks=self.fallbacks,
            exposed_migration_s=self.exposed,
            prefill_tokens=sum(w.prefill_tokens for w in self.workers),
            tail_queue_s=last.queued_s,
            accuracy=acc
            if self.system.scheduling == "progressive" or self.system.placement == "heddle"
            else (),
            plan_s=self.plan_s,
            wall_s=time.perf_counter() - started,
        )


def _finished(cfg: systems.StepConfig, shape: workload.Shape) -> predictor.Finished:
    return predictor.Finished(cfg.domain.name, str(shape.group), shape.output, shape.responses)


def run(cfg: systems.StepConfig, systems: Sequence[systems.System]) -> list[systems.StepResult]:
    """Every system on the same batch (and the same predictor history: the previous epoch)."""
    rng = random.Random(cfg.seed)
    prompts = cfg.trajectories // cfg.group_size
    batch = workload.draw_batch(cfg.domain, prompts=prompts, group_size=cfg.group_size, rng=rng)
    # the predictor's history: the same prompts' rollouts one epoch earlier (RhymeRL/Seer-style)
    history = workload.redraw(cfg.domain, batch, cfg.group_size, random.Random(cfg.seed + 7))
    return [StepSim(cfg, s, batch, history).run() for s in systems]
