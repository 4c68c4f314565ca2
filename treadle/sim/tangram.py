"""ARL-Tangram reproduction: action-level elastic management against trajectory- and task-level allocation.

Called by the ``tangram`` scenario kind (``treadle simulate``, ``bench/sim_tangram.py``) and tests.
One run is one rollout step: ``batch`` trajectories start together and each alternates LLM
generation (a delay: the policy GPUs are not modelled) with external actions, submitted as the
previous step ends (sequence-level asynchronous rollout, §6.1). The step ends with the last
trajectory. Two workloads, each against its paper baseline:

* **coding** (CPU): ``turns`` tool calls (one core, not scalable, milliseconds to seconds) then a
  reward run (tests, CPU-scalable: Amdahl's law with serial fraction ``serial``, long-tailed).

  - ``tangram``: the CPU manager (§5.2): a trajectory's container is placed at its first action
    (``cores.place``, which pays ``container_start_s`` once) and stays on that node; each node has
    its own FCFS queue and runs ``schedule.decide`` (Alg. 1-3, ``depth``, ``horizon``) whenever an
    action arrives or ends there; cores are exclusive; every action pays ``overhead_s`` (cgroup
    update + exec; Table 1). The scheduler sees the reward runs' elasticity *fitted* from probe runs
    (``profile.fit``), their ``T_ori`` with a lognormal error of ``estimate_cv``, and the tool
    calls' historical average (``profile.Average``, updated as they end).
  - ``fixed-dop=<n>``: the same, but every reward run asks for exactly ``n`` cores (Fig. 9).
  - ``k8s``: a pod per trajectory, requested when the trajectory starts: the control plane creates
    ``pods_per_s`` pods a second in FIFO order, the scheduler places each on a node with
    ``pod_cpu_request`` cores and the trajectory's memory unrequested (else it stays pending), and
    it runs ``pod_start_s`` later; a request the control plane has not reached ``pod_timeout_s``
    after it was made times out and is made again. Actions run in their pod with ``baseline_dop``
    threads, at most ``pod_cpu_limit`` cores; a node's cores are shared fairly among its running
    actions (CFS with equal requests: water-filling under each action's cap, so an action on ``x``
    of its ``d`` threads' cores runs at ``x / d`` speed). The pod holds its request until the
    trajectory ends.

* **mopd** (GPU): ``services`` teacher models, one per RL task; tasks get unequal shares of the
  batch (``task_skew``) and generation times scaled so they interleave (``task_spread``); a
  trajectory's one action computes log-probs under its teacher (GPU-scalable over {1, 2, 4, 8}).

  - ``tangram``: the GPU manager (§5.3): one FCFS queue over the pool of ``nodes`` x 8 GPUs,
    ``schedule.decide`` over ``pools.ChunkPool`` (Alg. 4), then ``buddy.allocate`` places each grant
    (aligned chunk, cache affinity, LRU); a variant not resident is restored from host memory in
    ``restore_fixed_s + model_gb / k / restore_gbps`` (its shard moves over every GPU's link at
    once) before it runs; at most one action per GPU.
  - ``static``: every teacher on its own ``static_gpus`` GPUs (TP), whatever ``nodes`` says (the
    over-provisioned reference of Fig. 8b's right half), one action at a time (a teacher forward
    over a whole trajectory is compute-bound prefill, so batching several would not shorten the
    queue; ours), FCFS per teacher.

Everything is simulated; the decision times are measured (wall clock around ``schedule.decide``).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import heapq
import itertools
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence

from treadle import errors
from treadle.policy.tangram import buddy, cores, model, pools, profile, schedule
from treadle.sim import workloads

MAX_EVENTS = 5_000_000
"""Bound on the events of one run."""
PROBE_UNITS = (1, 2, 4, 8, 16, 32)
"""Amounts the profiling probes run at (three runs each, 5 % noise)."""


@dataclasses.dataclass(frozen=True)
class Coding:
    batch: int
    nodes: int
    turns: workloads.Dist
    gen_s: workloads.Dist
    tool_s: workloads.Dist
    reward_s: workloads.Dist
    """``T_ori`` of a reward run: its tests on one core."""
    serial: float
    """Amdahl serial fraction of the reward runs (the true curve the probes sample)."""
    cores_per_node: int = 256
    memory_gb_per_node: float = 2400.0
    trajectory_memory_gb: float = 8.0
    max_dop: int = 32
    estimate_cv: float = 0.3
    overhead_s: float = 0.024
    container_start_s: float = 1.0
    pod_start_s: float = 2.0
    pods_per_s: float = 20.0
    pod_timeout_s: float = 300.0
    pod_cpu_request: float = 0.5
    pod_cpu_limit: float = 4.0
    baseline_dop: int = 4
    depth: int = schedule.DEFAULT_DEPTH
    horizon: int | None = 64
    head_always_runs: bool = False
    seed: int = 0


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


@dataclasses.dataclass
class Record:
    traj: int
    kind: str
    """``tool`` or ``reward``."""
    submit: float
    start: float = math.nan
    """Granted (queue ends)."""
    overhead: float = 0.0
    end: float = math.nan


@dataclasses.dataclass(frozen=True)
class Result:
    system: str
    act_s: float
    """Mean ACT over actions."""
    act_per_traj_s: float
    """Mean over trajectories of the sum of their actions' ACTs (Fig. 8's metric)."""
    stage_s: dict[str, float]
    """Per trajectory, the mean ACT sum of each action kind (Fig. 7's stages)."""
    breakdown: dict[str, dict[str, float]]
    """Kind -> mean queue, exec and overhead seconds per action (Table 1)."""
    makespan_s: float
    busy_fraction: float
    """Mean over trajectories of (ACT sum / lifetime) (Fig. 3c: 47 %)."""
    decision_ms: float
    """Median wall time of one ``schedule.decide`` (nan for the baselines)."""
    decisions: int
    restores: int
    timeouts: int


@dataclasses.dataclass(frozen=True)
class Job:
    """One action of a trajectory as the workload drew it."""

    traj: int
    kind: str
    t_true: float
    """Tool: its duration; reward: its one-unit duration."""
    t_est: float
    """What the profile says ``T_ori`` is (reward runs)."""
    service: int = 0


class _Loop:
    """The event heap of one run: ``(time, sequence)`` orders it (handlers are closures)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.events = 0

    def at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), fn))

    def run(self) -> None:
        while self._heap:
            self.events += 1
            if self.events > MAX_EVENTS:
                raise errors.SpecError(f"more than {MAX_EVENTS} events", field="simulation.batch")
            self.now, _, fn = heapq.heappop(self._heap)
            fn()


class _Rollout:
    """The trajectories' steps: generation delays and actions, in order."""

    def __init__(self, loop: _Loop, plans: Sequence[Sequence[float | Job]]) -> None:
        self.loop, self.plans = loop, plans
        self.pos = [0] * len(plans)
        self.end = [math.nan] * len(plans)
        self.records: list[Record] = []
        self.submit: Callable[[Job, Record], None] = lambda job, rec: None
        self.on_end: Callable[[int], None] = lambda traj: None

    def start(self) -> None:
        for i in range(len(self.plans)):
            self.loop.at(0.0, functools.partial(self.step, i))

    def step(self, i: int) -> None:
        if self.pos[i] == len(self.plans[i]):
            self.end[i] = self.loop.now
            self.on_end(i)
            return
        item = self.plans[i][self.pos[i]]
        self.pos[i] += 1
        if isinstance(item, Job):
            rec = Record(i, item.kind, self.loop.now)
            self.records.append(rec)
            self.submit(item, rec)
        else:
            self.loop.at(self.loop.now + item, functools.partial(self.step, i))

    def done(self, job: Job, rec: Record) -> None:
        rec.end = self.loop.now
        self.step(job.traj)


def _probe(serial: float, rng: random.Random, units: Sequence[int], max_units: int) -> model.Elasticity:
    """The profiled elasticity: ``profile.fit`` over noisy probe runs of the true Amdahl curve."""
    samples = [
        (m, (serial + (1 - serial) / m) * rng.lognormvariate(0, 0.05)) for m in units for _ in range(3)
    ]
    fitted = profile.fit(samples, max_units)
    if fitted is None:
        raise errors.SpecError("the probes show no elasticity", field="simulation.serial", value=serial)
    return fitted


def _amdahl(t_one: float, serial: float, m: int) -> float:
    return t_one * (serial + (1 - serial) / m)


# ---------------------------------------------------------------------------------------- coding


def _coding_plans(cfg: Coding, rng: random.Random) -> list[list[float | Job]]:
    plans: list[list[float | Job]] = []
    for i in range(cfg.batch):
        plan: list[float | Job] = []
        turns = max(1, round(cfg.turns.sample(rng)))
        for _ in range(turns):
            plan.append(cfg.gen_s.sample(rng))
            t = cfg.tool_s.sample(rng)
            plan.append(Job(i, "tool", t, t))
        plan.append(cfg.gen_s.sample(rng))
        t = cfg.reward_s.sample(rng)
        plan.append(Job(i, "reward", t, t * rng.lognormvariate(0, cfg.estimate_cv)))
        plans.append(plan)
    return plans


class _CpuTangram:
    """Per-node FCFS queues scheduled by Alg. 1 (``fixed_dop``: reward runs ask for exactly that)."""

    def __init__(self, loop: _Loop, rollout: _Rollout, cfg: Coding, fixed_dop: int | None) -> None:
        self.loop, self.rollout, self.cfg = loop, rollout, cfg
        self.elasticity = _probe(cfg.serial, random.Random(cfg.seed + 1), PROBE_UNITS, cfg.max_dop)
        self.reward_cost = (fixed_dop,) if fixed_dop else tuple(range(1, cfg.max_dop + 1))
        self.tool_avg = profile.Average(mean=cfg.tool_s.mean, count=1)
        self.free = [cfg.cores_per_node] * cfg.nodes
        self.memory = [cfg.memory_gb_per_node] * cfg.nodes
        self.node: dict[int, int] = {}
        self.queues: list[list[tuple[model.Action, Job, Record]]] = [[] for _ in range(cfg.nodes)]
        self.running: list[dict[str, tuple[int, float]]] = [{} for _ in range(cfg.nodes)]
        """Per node: action id -> (cores, expected end)."""
        self.settings = schedule.Settings(cfg.depth, cfg.horizon, head_always_runs=cfg.head_always_runs)
        self.decision_s: list[float] = []
        self.ids = itertools.count()
        rollout.submit = self.submit
        rollout.on_end = self.end

    def submit(self, job: Job, rec: Record) -> None:
        cfg = self.cfg
        node = self.node.get(job.traj)
        if node is None:
            state = [
                cores.Node(f, cfg.cores_per_node, m, cfg.memory_gb_per_node)
                for f, m in zip(self.free, self.memory, strict=True)
            ]
            node = cores.place(state, cores=1, memory_gb=cfg.trajectory_memory_gb)
            if node is None:  # no free core anywhere: queue where the memory fits, least loaded
                node = cores.place(state, cores=0, memory_gb=cfg.trajectory_memory_gb)
            if node is None:
                raise errors.SpecError("trajectories outgrow the nodes' memory", field="simulation.batch")
            self.node[job.traj] = node
            self.memory[node] -= cfg.trajectory_memory_gb
            rec.overhead += cfg.container_start_s
        if job.kind == "tool":
            action = model.Action(f"a{next(self.ids)}", "cpu", {"cpu": (1,)}, self.tool_avg.mean)
        else:
            cost = {"cpu": self.reward_cost}
            action = model.Action(f"a{next(self.ids)}", "cpu", cost, job.t_est, self.elasticity)
        self.queues[node].append((action, job, rec))
        self._schedule(node)

    def _schedule(self, node: int) -> None:
        queue = self.queues[node]
        if not queue or not self.free[node]:
            return
        now = self.loop.now
        running = [model.Running("cpu", u, max(0.0, e - now)) for u, e in self.running[node].values()]
        status = {"cpu": pools.FlatPool(self.free[node], self.cfg.cores_per_node)}
        started = time.perf_counter()
        grants = schedule.decide([a for a, _, _ in queue], running, status, self.settings)
        self.decision_s.append(time.perf_counter() - started)
        granted = {g.action_id: g.units["cpu"] for g in grants}
        self.queues[node] = [q for q in queue if q[0].id not in granted]
        for action, job, rec in queue:
            if action.id in granted:
                self._start(node, action, job, rec, granted[action.id])

    def _start(self, node: int, action: model.Action, job: Job, rec: Record, units: int) -> None:
        now = self.loop.now
        rec.start = now
        rec.overhead += self.cfg.overhead_s
        run = job.t_true if job.kind == "tool" else _amdahl(job.t_true, self.cfg.serial, units)
        self.free[node] -= units
        end = now + rec.overhead + run
        self.running[node][action.id] = (units, now + self.cfg.overhead_s + action.duration(units))
        self.loop.at(end, lambda: self._finish(node, action, job, rec, units, run))

    def _finish(self, node: int, action: model.Action, job: Job, rec: Record, units: int, run: float) -> None:
        self.free[node] += units
        del self.running[node][action.id]
        if job.kind == "tool":
            self.tool_avg = self.tool_avg.observe(run)
        self.rollout.done(job, rec)
        self._schedule(node)

    def end(self, traj: int) -> None:
        self.memory[self.node[traj]] += self.cfg.trajectory_memory_gb


class _CpuK8s:
    """A pod per trajectory (control-plane FIFO, pending, timeouts) and CFS sharing inside a node."""

    def __init__(self, loop: _Loop, rollout: _Rollout, cfg: Coding) -> None:
        self.loop, self.rollout, self.cfg = loop, rollout, cfg
        self.requested = [0.0] * cfg.nodes
        self.memory = [0.0] * cfg.nodes
        self.pod: dict[int, int] = {}
        """Trajectory -> node of its pod, once it runs."""
        self.waiting: dict[int, tuple[Job, Record]] = {}
        """Actions whose pod is not running yet."""
        self.pending: list[int] = []
        """Trajectories of created pods no node can take yet."""
        self.backlog: collections.deque[tuple[int, float]] = collections.deque()
        """Pod requests waiting for the control plane: (trajectory, request time)."""
        self.creating = False
        self.timeouts = 0
        self.jobs: list[dict[int, list[float]]] = [{} for _ in range(cfg.nodes)]
        """Per node: record index -> [work left, threads, cap, speed]."""
        self.last = [0.0] * cfg.nodes
        self.version = [0] * cfg.nodes
        self.live: dict[int, tuple[Job, Record]] = {}
        self.keys = itertools.count()
        rollout.submit = self.submit
        rollout.on_end = self.end
        for i in range(cfg.batch):
            self._request(i, 0.0)

    def _request(self, traj: int, asked: float) -> None:
        self.backlog.append((traj, asked))
        self._serve()

    def _serve(self) -> None:
        """Create the next pod; a request older than the timeout is dropped and asked again (at the
        back, costing the control plane nothing), so the backlog always drains."""
        if self.creating:
            return
        while self.backlog:  # ends: a request asked again is fresh
            traj, asked = self.backlog.popleft()
            if self.loop.now - asked <= self.cfg.pod_timeout_s:
                self.creating = True
                self.loop.at(
                    self.loop.now + 1.0 / self.cfg.pods_per_s, functools.partial(self._created, traj)
                )
                return
            self.timeouts += 1
            self.backlog.append((traj, self.loop.now))

    def _created(self, traj: int) -> None:
        self.creating = False
        self._serve()
        self._place(traj)

    def _place(self, traj: int) -> None:
        cfg = self.cfg
        fits = [
            n
            for n in range(cfg.nodes)
            if self.requested[n] + cfg.pod_cpu_request <= cfg.cores_per_node
            and self.memory[n] + cfg.trajectory_memory_gb <= cfg.memory_gb_per_node
        ]
        if not fits:
            self.pending.append(traj)
            return
        node = min(fits, key=lambda n: (self.requested[n], n))  # least allocated
        self.requested[node] += cfg.pod_cpu_request
        self.memory[node] += cfg.trajectory_memory_gb
        self.loop.at(self.loop.now + cfg.pod_start_s, lambda: self._running(traj, node))

    def _running(self, traj: int, node: int) -> None:
        self.pod[traj] = node
        if traj in self.waiting:
            self._exec(*self.waiting.pop(traj))

    def submit(self, job: Job, rec: Record) -> None:
        if job.traj in self.pod:
            self._exec(job, rec)
        else:
            self.waiting[job.traj] = (job, rec)

    def _exec(self, job: Job, rec: Record) -> None:
        cfg = self.cfg
        node = self.pod[job.traj]
        rec.start = self.loop.now
        rec.overhead = cfg.overhead_s
        threads = 1 if job.kind == "tool" else cfg.baseline_dop
        work = job.t_true if job.kind == "tool" else _amdahl(job.t_true, cfg.serial, threads)
        self._advance(node)
        key = next(self.keys)
        self.live[key] = (job, rec)
        self.jobs[node][key] = [work + cfg.overhead_s, threads, min(threads, cfg.pod_cpu_limit), 0.0]
        self._reshare(node)

    def _advance(self, node: int) -> None:
        dt = self.loop.now - self.last[node]
        for j in self.jobs[node].values():
            j[0] -= dt * j[3]
        self.last[node] = self.loop.now

    def _reshare(self, node: int) -> None:
        jobs = self.jobs[node]
        left, n = float(self.cfg.cores_per_node), len(jobs)
        for j in sorted(jobs.values(), key=lambda j: j[2]):  # water-filling under each cap
            x = min(j[2], left / n)
            j[3] = x / j[1]
            left -= x
            n -= 1
        self.version[node] += 1
        if jobs:
            key, j = min(jobs.items(), key=lambda kv: kv[1][0] / kv[1][3])
            v = self.version[node]
            self.loop.at(self.loop.now + max(0.0, j[0] / j[3]), lambda: self._done(node, key, v))

    def _done(self, node: int, key: int, version: int) -> None:
        if version != self.version[node]:
            return
        self._advance(node)
        del self.jobs[node][key]
        job, rec = self.live.pop(key)
        self._reshare(node)
        self.rollout.done(job, rec)

    def end(self, traj: int) -> None:
        node = self.pod.pop(traj)
        self.requested[node] -= self.cfg.pod_cpu_request
        self.memory[node] -= self.cfg.trajectory_memory_gb
        if self.pending:
            self._place(self.pending.pop(0))


# ------------------------------------------------------------------------------------------ mopd


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

    def __init__(self, loop: _Loop, rollout: _Rollout, cfg: Mopd) -> None:
        self.loop, self.rollout, self.cfg = loop, rollout, cfg
        self.elasticity = _probe(cfg.serial, random.Random(cfg.seed + 1), buddy.SIZES, buddy.NODE_GPUS)
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
        run = _amdahl(job.t_true, cfg.serial, k)
        self.running[action.id] = (k, now + rec.overhead + action.duration(k))
        self.loop.at(now + rec.overhead + run, lambda: self._finish(action, job, rec, placement.chunk))

    def _finish(self, action: model.Action, job: Job, rec: Record, chunk: buddy.Chunk) -> None:
        self.pool = buddy.release(self.pool, chunk)
        del self.running[action.id]
        self.rollout.done(job, rec)
        self._schedule()


class _GpuStatic:
    """Each teacher on its own ``static_gpus`` GPUs, one action at a time, FCFS."""

    def __init__(self, loop: _Loop, rollout: _Rollout, cfg: Mopd) -> None:
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
        end = self.loop.now + rec.overhead + _amdahl(job.t_true, self.cfg.serial, self.cfg.static_gpus)
        self.loop.at(end, lambda: self._done(job, rec))

    def _done(self, job: Job, rec: Record) -> None:
        self.busy[job.service] = False
        self.rollout.done(job, rec)
        self._next(job.service)


# ------------------------------------------------------------------------------------------- run

FIXED_DOP = "fixed-dop="
"""``fixed-dop=<n>``: Tangram's scheduler, every reward run asking for exactly ``n`` cores (Fig. 9)."""
CODING_SYSTEMS = ("tangram", "k8s", f"{FIXED_DOP}4", f"{FIXED_DOP}16")
MOPD_SYSTEMS = ("tangram", "static")


def run_coding(cfg: Coding, system: str) -> Result:
    loop = _Loop()
    rollout = _Rollout(loop, _coding_plans(cfg, random.Random(cfg.seed)))
    decisions: list[float] = []
    timeouts = 0
    if system == "k8s":
        k8s = _CpuK8s(loop, rollout, cfg)
    elif system == "tangram" or system.startswith(FIXED_DOP):
        dop = int(system[len(FIXED_DOP) :]) if system != "tangram" else None
        if dop is not None and not 1 <= dop <= cfg.cores_per_node:
            raise errors.SpecError("a fixed DoP is 1 .. cores per node", field="--runs", value=system)
        tangram = _CpuTangram(loop, rollout, cfg, dop)
    else:
        raise errors.SpecError(f"unknown system {system!r}; known: {list(CODING_SYSTEMS)}", field="--runs")
    rollout.start()
    loop.run()
    if system == "k8s":
        timeouts = k8s.timeouts
    else:
        decisions = tangram.decision_s
    return _result(system, rollout, decisions, restores=0, timeouts=timeouts)


def run_mopd(cfg: Mopd, system: str) -> Result:
    loop = _Loop()
    rollout = _Rollout(loop, _mopd_plans(cfg, random.Random(cfg.seed)))
    if system == "tangram":
        tangram = _GpuTangram(loop, rollout, cfg)
    elif system == "static":
        _GpuStatic(loop, rollout, cfg)
    else:
        raise errors.SpecError(f"unknown system {system!r}; known: {list(MOPD_SYSTEMS)}", field="--runs")
    rollout.start()
    loop.run()
    if system == "tangram":
        return _result(system, rollout, tangram.decision_s, restores=tangram.restores, timeouts=0)
    return _result(system, rollout, [], restores=0, timeouts=0)


def _result(
    system: str, rollout: _Rollout, decisions: Sequence[float], *, restores: int, timeouts: int
) -> Result:
    recs = rollout.records
    n = len(rollout.plans)
    per_traj = [0.0] * n
    per_kind: dict[str, list[float]] = {}
    for r in recs:
        act = r.end - r.submit
        per_traj[r.traj] += act
        per_kind.setdefault(r.kind, [0.0] * n)[r.traj] += act
    lifetime = rollout.end
    breakdown = {}
    for kind in sorted({r.kind for r in recs}):
        rs = [r for r in recs if r.kind == kind]
        breakdown[kind] = {
            "queue_s": statistics.fmean(r.start - r.submit for r in rs),
            "exec_s": statistics.fmean(r.end - r.start - r.overhead for r in rs),
            "overhead_s": statistics.fmean(r.overhead for r in rs),
        }
    return Result(
        system=system,
        act_s=statistics.fmean(r.end - r.submit for r in recs),
        act_per_traj_s=statistics.fmean(per_traj),
        stage_s={k: statistics.fmean(v) for k, v in sorted(per_kind.items())},
        breakdown=breakdown,
        makespan_s=max(lifetime),
        busy_fraction=statistics.fmean(a / t for a, t in zip(per_traj, lifetime, strict=True) if t > 0),
        decision_ms=statistics.median(decisions) * 1e3 if decisions else math.nan,
        decisions=len(decisions),
        restores=restores,
        timeouts=timeouts,
    )
