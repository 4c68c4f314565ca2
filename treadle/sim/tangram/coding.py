"""The **coding** workload (CPU) of the ARL-Tangram reproduction, and the systems it compares.

``turns`` tool calls (one core, not scalable, milliseconds to seconds) then a reward run (tests,
CPU-scalable: Amdahl's law with serial fraction ``serial``, long-tailed).

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
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import random
import time

from treadle import errors
from treadle.policy.tangram import cores, model, pools, profile, schedule
from treadle.sim import workloads
from treadle.sim.tangram.common import Job, Loop, Record, Result, Rollout, amdahl, probe, result

FIXED_DOP = "fixed-dop="
"""``fixed-dop=<n>``: Tangram's scheduler, every reward run asking for exactly ``n`` cores (Fig. 9)."""
CODING_SYSTEMS = ("tangram", "k8s", f"{FIXED_DOP}4", f"{FIXED_DOP}16")
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


class CpuTangram:
    """Per-node FCFS queues scheduled by Alg. 1 (``fixed_dop``: reward runs ask for exactly that)."""

    def __init__(self, loop: Loop, rollout: Rollout, cfg: Coding, fixed_dop: int | None) -> None:
        self.loop, self.rollout, self.cfg = loop, rollout, cfg
        self.elasticity = probe(cfg.serial, random.Random(cfg.seed + 1), PROBE_UNITS, cfg.max_dop)
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
        run = job.t_true if job.kind == "tool" else amdahl(job.t_true, self.cfg.serial, units)
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

    def __init__(self, loop: Loop, rollout: Rollout, cfg: Coding) -> None:
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
        work = job.t_true if job.kind == "tool" else amdahl(job.t_true, cfg.serial, threads)
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


def run_coding(cfg: Coding, system: str) -> Result:
    loop = Loop()
    rollout = Rollout(loop, _coding_plans(cfg, random.Random(cfg.seed)))
    decisions: list[float] = []
    timeouts = 0
    if system == "k8s":
        k8s = _CpuK8s(loop, rollout, cfg)
    elif system == "tangram" or system.startswith(FIXED_DOP):
        dop = int(system[len(FIXED_DOP) :]) if system != "tangram" else None
        if dop is not None and not 1 <= dop <= cfg.cores_per_node:
            raise errors.SpecError("a fixed DoP is 1 .. cores per node", field="--runs", value=system)
        tangram = CpuTangram(loop, rollout, cfg, dop)
    else:
        raise errors.SpecError(f"unknown system {system!r}; known: {list(CODING_SYSTEMS)}", field="--runs")
    rollout.start()
    loop.run()
    if system == "k8s":
        timeouts = k8s.timeouts
    else:
        decisions = tangram.decision_s
    return result(system, rollout, decisions, restores=0, timeouts=timeouts)
