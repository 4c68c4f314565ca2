"""The **mopd** workload (GPU) of the ARL-Tangram reproduction, and the systems it compares.

``services`` teacher models, one per RL task; tasks get unequal shares of the batch
(``task_skew``) and generation times scaled so they interleave (``task_spread``); a trajectory's
one action computes log-probs under its teacher (GPU-scalable over {1, 2, 4, 8}).

- ``tangram``: the GPU manager (§5.3): one FCFS queue over the pool of ``nodes`` x 8 GPUs,
  ``schedule.decide`` over ``pools.ChunkPool`` (Alg. 4), then ``buddy.allocate`` places each grant
  (aligned chunk, cache affinity, LRU); a variant not resident is restored from host memory in
  ``restore_fixed_s + model_gb / k / restore_gbps`` (its shard moves over every GPU's link at
  once) before it runs; at most one action per GPU.
- ``static``: every teacher on its own ``static_gpus`` GPUs (TP), whatever ``nodes`` says (the
  over-provisioned reference of Fig. 8b's right half), one action at a time (a teacher forward
  over a whole trajectory is compute-bound prefill, so batching several would not shorten the
  queue; ours), FCFS per teacher.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import time

from treadle import errors
from treadle.policy.tangram import buddy, model, pools, schedule
from treadle.sim import workloads
from treadle.sim.tangram.common import Job, Loop, Record, Result, Rollout, amdahl, probe, result

MOPD_SYSTEMS = ("tangram", "static")


@dataclasses.dataclass(frozen=True)
class Mopd:
    batch: int
    nodes: int
    gen_s: workloads.Dist
    reward_s: workloads.Dist
    """``T_ori`` of a teacher forward on one GPU."""
    serial: float
    services: int = 10
    task_skew: float = 1.0
    """Task ``s`` gets a share of the batch proportional to ``1 / (s + 1) ** task_skew``."""
    task_spread: float = 0.5
    """Task ``s``'s generation time is scaled by ``1 ± task_spread`` (first to last task)."""
    gpu_gb: float = 80.0
    model_gb: float = 30.0
    activation_gb: float = 8.0
    restore_gbps: float = 50.0
    restore_fixed_s: float = 0.05
    overhead_s: float = 0.01
    static_gpus: int = 4
    depth: int = schedule.DEFAULT_DEPTH
    horizon: int | None = 64
    head_always_runs: bool = False
    seed: int = 0


def _mopd_plans(cfg: Mopd, rng: random.Random) -> list[list[float | Job]]:
    plans: list[list[float | Job]] = []
    weights = [1.0 / (s + 1) ** cfg.task_skew for s in range(cfg.services)]
    for i in range(cfg.batch):
        (service,) = rng.choices(range(cfg.services), weights)
        scale = 1.0 + cfg.task_spread * (2 * service / max(1, cfg.services - 1) - 1)
        t = cfg.reward_s.sample(rng)
        plans.append([cfg.gen_s.sample(rng) * scale, Job(i, "reward", t, t, service)])
    return plans


class _GpuTangram:
    """One FCFS queue over the buddy GPU pool, Alg. 1 over ``ChunkPool``, restores from host memory."""

    def __init__(self, loop: Loop, rollout: Rollout, cfg: Mopd) -> None:
        self.loop, self.rollout, self.cfg = loop, rollout, cfg
        self.elasticity = probe(cfg.serial, random.Random(cfg.seed + 1), buddy.SIZES, buddy.NODE_GPUS)
        self.pool = buddy.empty(cfg.nodes, cfg.gpu_gb)
        self.queue: list[tuple[model.Action, Job, Record]] = []
        self.running: dict[str, tuple[int, float]] = {}
        self.settings = schedule.Settings(cfg.depth, cfg.horizon, head_always_runs=cfg.head_always_runs)
        self.decision_s: list[float] = []
        self.restores = 0
        self.ids = itertools.count()
        rollout.submit = self.submit

    def submit(self, job: Job, rec: Record) -> None:
        cost = {"gpu": buddy.SIZES}
        self.queue.append(
            (model.Action(f"a{next(self.ids)}", "gpu", cost, job.t_est, self.elasticity), job, rec)
        )
        self._schedule()

    def _schedule(self) -> None:
        if not self.queue or not self.pool.free:
            return
        now = self.loop.now
        running = [model.Running("gpu", u, max(0.0, e - now)) for u, e in self.running.values()]
        status = {"gpu": pools.ChunkPool(buddy.inventory(self.pool), self.cfg.nodes * buddy.NODE_GPUS)}
        started = time.perf_counter()
        grants = schedule.decide([a for a, _, _ in self.queue], running, status, self.settings)
        self.decision_s.append(time.perf_counter() - started)
        granted = {g.action_id: g.units["gpu"] for g in grants}
        queue, self.queue = self.queue, [q for q in self.queue if q[0].id not in granted]
        for action, job, rec in queue:
            if action.id in granted:
                self._start(action, job, rec, granted[action.id])

    def _start(self, action: model.Action, job: Job, rec: Record, k: int) -> None:
        cfg = self.cfg
        shard = cfg.model_gb / k
        got = buddy.allocate(self.pool, k, f"teacher{job.service}@tp{k}", shard + cfg.activation_gb)
        if got is None:  # Alg. 1 admitted by buddy.fits: the allocator must agree
            raise RuntimeError(f"no chunk of {k} GPUs for a granted action")
        self.pool, placement = got
        now = self.loop.now
        rec.start = now
        rec.overhead = cfg.overhead_s + (cfg.restore_fixed_s + shard / cfg.restore_gbps) * placement.restore
        self.restores += placement.restore
        run = amdahl(job.t_true, cfg.serial, k)
        self.running[action.id] = (k, now + rec.overhead + action.duration(k))
        self.loop.at(now + rec.overhead + run, lambda: self._finish(action, job, rec, placement.chunk))

    def _finish(self, action: model.Action, job: Job, rec: Record, chunk: buddy.Chunk) -> None:
        self.pool = buddy.release(self.pool, chunk)
        del self.running[action.id]
        self.rollout.done(job, rec)
        self._schedule()


class _GpuStatic:
    """Each teacher on its own ``static_gpus`` GPUs, one action at a time, FCFS."""

    def __init__(self, loop: Loop, rollout: Rollout, cfg: Mopd) -> None:
        self.loop, self.rollout, self.cfg = loop, rollout, cfg
        self.queues: list[list[tuple[Job, Record]]] = [[] for _ in range(cfg.services)]
        self.busy = [False] * cfg.services
        rollout.submit = self.submit

    def submit(self, job: Job, rec: Record) -> None:
        self.queues[job.service].append((job, rec))
        self._next(job.service)

    def _next(self, s: int) -> None:
        if self.busy[s] or not self.queues[s]:
            return
        job, rec = self.queues[s].pop(0)
        self.busy[s] = True
        rec.start = self.loop.now
        rec.overhead = self.cfg.overhead_s
        end = self.loop.now + rec.overhead + amdahl(job.t_true, self.cfg.serial, self.cfg.static_gpus)
        self.loop.at(end, lambda: self._done(job, rec))

    def _done(self, job: Job, rec: Record) -> None:
        self.busy[job.service] = False
        self.rollout.done(job, rec)
        self._next(job.service)


def run_mopd(cfg: Mopd, system: str) -> Result:
    loop = Loop()
    rollout = Rollout(loop, _mopd_plans(cfg, random.Random(cfg.seed)))
    if system == "tangram":
        tangram = _GpuTangram(loop, rollout, cfg)
    elif system == "static":
        _GpuStatic(loop, rollout, cfg)
    else:
        raise errors.SpecError(f"unknown system {system!r}; known: {list(MOPD_SYSTEMS)}", field="--runs")
    rollout.start()
    loop.run()
    if system == "tangram":
        return result(system, rollout, tangram.decision_s, restores=tangram.restores, timeouts=0)
    return result(system, rollout, [], restores=0, timeouts=0)
