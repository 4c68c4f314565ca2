"""The pod's CPU action manager (ARL-Tangram §4.2 and §5.2, live): cores granted per action.

Every sandboxed run (a python-code attempt in the env pod, a code-tests reward run) asks this
manager for cores before its code starts (``runner.Sandbox``). Requests wait in one FCFS queue;
on every arrival and every completion the manager runs ``treadle.policy.tangram.schedule.decide``
(Alg. 1 with Alg. 2, ``depth = 2``, the horizon of the simulator's scenarios) over the queue, the
runs in flight and the free cores as one ``FlatPool`` (the paper runs one scheduler per node; the
trajectory is pinned to its pod, so the pod's cores are the node), and gives each grant its exact
cores with ``treadle.policy.tangram.cores.pick`` (one NUMA domain when one has room). Grants are
disjoint: a core serves one action at a time, and an action that finds none free waits its turn.

Durations and elasticity are profiled per action *kind* (``python-code``, ``code-tests``), never
typed in: ``profile.Average`` of the measured durations at each amount granted, and ``profile.fit``
(Amdahl) over those averages normalised by the one-core mean. Until a kind has runs at two
amounts its elasticity is unknown and it runs at one amount (Alg. 1 line 6), chosen to probe:
first ``upper`` (what ``cpuCoresPerAction`` gave every run before this manager), then 1 core; after
that the scheduler picks from ``1 .. upper`` by the fitted curve. A kind whose runs do not speed
up fits ``E(m) = 1/m`` and keeps getting one core, so cores are not wasted on code that cannot use
them.

``upper`` is ``spec.externalResources.cpuCoresPerAction`` rounded up (and at most the pod's CPUs):
the most cores one action is granted, and the amount of the first probe. ``1`` keeps every action
on one core with no probing.

The granted count reaches the run as ``TREADLE_GRANTED_CORES`` and the OMP/MKL/OpenBLAS thread
variables (``runner``), so code can size its own parallelism (``pytest -n $TREADLE_GRANTED_CORES``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import decimal
import itertools
import math
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import prometheus_client
from kubernetes.utils import quantity

from treadle import errors, metrics
from treadle.policy.tangram import cores as policy_cores
from treadle.policy.tangram import model, pools, profile, schedule

CPU = "cpu"
"""The resource type of the cost vectors (and the ``resource`` label of the metrics)."""
SETTINGS = schedule.Settings(depth=schedule.DEFAULT_DEPTH, horizon=64)
"""The paper's depth; the horizon the simulator's scenarios use (``docs/TANGRAM.md``)."""
PHASES = ("queue", "execution", "overhead")
CPU_PER_ACTION_FIELD = "spec.externalResources.cpuCoresPerAction"
"""Table 1's split of an action's completion time."""


class ActionMetrics:
    """Per resource type: the queue / execution / overhead split, queued actions, granted units.

    One per app (its registry); the CPU manager and the API quotas of a pod share it.
    """

    def __init__(self, registry: prometheus_client.CollectorRegistry) -> None:
        self.seconds = prometheus_client.Histogram(
            metrics.TANGRAM_ACTION_SECONDS, "Action completion time by phase (ARL-Tangram Table 1)",
            ["resource", "phase"], registry=registry,
            buckets=(0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60),
        )  # fmt: skip
        self.queued = prometheus_client.Gauge(
            metrics.TANGRAM_QUEUED, "Actions waiting for a grant", ["resource"], registry=registry
        )
        self.units = prometheus_client.Counter(
            metrics.TANGRAM_GRANTED_UNITS_TOTAL, "Units granted to actions", ["resource"], registry=registry
        )

    def phases(self, resource: str, *, queue_s: float, execution_s: float, total_s: float) -> None:
        """Record one action; overhead is what its completion time spent outside queue and execution."""
        overhead = max(0.0, total_s - queue_s - execution_s)
        for phase, value in zip(PHASES, (queue_s, execution_s, overhead), strict=True):
            self.seconds.labels(resource, phase).observe(value)


@dataclasses.dataclass(frozen=True)
class Grant:
    kind: str
    cores: tuple[int, ...]
    queued_s: float
    """From the request to the grant."""

    @property
    def units(self) -> int:
        return len(self.cores)


@dataclasses.dataclass(eq=False)
class _Request:
    action: model.Action
    kind: str
    since: float
    future: asyncio.Future[Grant]


@dataclasses.dataclass(frozen=True)
class _Run:
    units: int
    started: float
    expected_s: float


class CoreManager:
    """Grants disjoint core sets to the pod's actions in FCFS order (module doc).

    ``cpus``: the cores to manage (default: this process's affinity); ``domains``: their NUMA
    domains (default: read from sysfs). ``clock`` is a seam for tests.
    """

    def __init__(
        self,
        *,
        upper: int,
        cpus: Sequence[int] | None = None,
        domains: Sequence[Sequence[int]] | None = None,
        settings: schedule.Settings = SETTINGS,
        clock: Callable[[], float] = time.monotonic,
        action_metrics: ActionMetrics | None = None,
    ) -> None:
        allowed = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
        if not allowed:
            raise ValueError("a core manager needs at least one core")
        self.domains = [list(d) for d in (domains or numa_domains(allowed))]
        self.total = len(allowed)
        self.upper = max(1, min(upper, self.total))
        self.settings, self.clock = settings, clock
        self.metrics = action_metrics or ActionMetrics(prometheus_client.CollectorRegistry())
        self.profiles: dict[str, profile.KindProfile] = {}
        self._free = set(allowed)
        self._waiting: list[_Request] = []
        self._running: dict[tuple[int, ...], _Run] = {}
        self._ids = itertools.count()

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def queued(self) -> int:
        return len(self._waiting)

    def profile(self, kind: str) -> profile.KindProfile:
        """What the manager learned of ``kind`` (amounts ``1 .. upper``; empty before its first run)."""
        return self.profiles.setdefault(kind, profile.KindProfile(CPU, tuple(range(1, self.upper + 1))))

    @contextlib.asynccontextmanager
    async def cores(self, kind: str) -> AsyncIterator[Grant]:
        """Hold a grant for the body; the body's duration is the kind's next profile sample."""
        grant = await self.acquire(kind)
        started = self.clock()
        try:
            yield grant
        finally:
            self.release(grant, duration_s=self.clock() - started)

    async def acquire(self, kind: str) -> Grant:
        """Wait in the FCFS queue for a grant; a cancelled wait leaves the queue (or frees its grant)."""
        kind_profile = self.profiles.setdefault(
            kind, profile.KindProfile(CPU, tuple(range(1, self.upper + 1)))
        )
        action = kind_profile.action(f"{kind}-{next(self._ids)}")
        request = _Request(action, kind, self.clock(), asyncio.get_running_loop().create_future())
        self._waiting.append(request)
        self._schedule()
        try:
            return await asyncio.shield(request.future)
        except asyncio.CancelledError:
            if request in self._waiting:
                self._waiting.remove(request)
                self.metrics.queued.labels(CPU).set(len(self._waiting))
            elif request.future.done() and not request.future.cancelled():
                self._give_back(request.future.result())
            raise

    def release(self, grant: Grant, *, duration_s: float) -> None:
        """The action ended after ``duration_s`` of execution: learn from it, free its cores."""
        self.profile(grant.kind).observe(grant.units, duration_s)
        self._give_back(grant)

    def _give_back(self, grant: Grant) -> None:
        self._running.pop(grant.cores, None)
        self._free.update(grant.cores)
        self._schedule()

    def _schedule(self) -> None:
        """One round of Alg. 1 over the queue; grants resolve their waiters' futures."""
        self._waiting = [r for r in self._waiting if not r.future.done()]
        if self._waiting and self._free:
            now = self.clock()
            running = [
                model.Running(CPU, run.units, max(0.0, run.expected_s - (now - run.started)))
                for run in self._running.values()
            ]
            status = {CPU: pools.FlatPool(len(self._free), self.total)}
            grants = schedule.decide([r.action for r in self._waiting], running, status, self.settings)
            units = {g.action_id: g.units[CPU] for g in grants}
            left = []
            for r in self._waiting:
                if (n := units.get(r.action.id)) is None:
                    left.append(r)
                    continue
                free = [[c for c in d if c in self._free] for d in self.domains]
                chosen = policy_cores.pick(free, n)
                self._free.difference_update(chosen)
                self._running[chosen] = _Run(n, now, r.action.duration(n))
                self.metrics.units.labels(CPU).inc(n)
                r.future.set_result(Grant(r.kind, chosen, now - r.since))
            self._waiting = left
        self.metrics.queued.labels(CPU).set(len(self._waiting))


def cpus_per_action(raw: str) -> int:
    """``upper`` from ``cpuCoresPerAction``: the Kubernetes quantity rounded up (``500m`` is 1 CPU)."""
    try:
        cores: decimal.Decimal = quantity.parse_quantity(raw.strip())  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise errors.SpecError(
            f"must be a Kubernetes CPU quantity such as 1, 2 or 500m, got {raw!r}",
            field=CPU_PER_ACTION_FIELD, value=raw,
        ) from exc  # fmt: skip
    if cores <= 0:
        raise errors.SpecError("must be more than 0 cores", field=CPU_PER_ACTION_FIELD, value=raw)
    return math.ceil(cores)


def numa_domains(cpus: Sequence[int], sysfs: Path = Path("/sys/devices/system/node")) -> list[list[int]]:
    """``cpus`` grouped by NUMA node (sysfs ``cpulist``); one domain when the machine says nothing."""
    wanted, domains = set(cpus), []
    for node in sorted(sysfs.glob("node[0-9]*")):
        try:
            listed = _cpulist((node / "cpulist").read_text())
        except OSError:
            continue
        if mine := sorted(wanted & listed):
            domains.append(mine)
    seen = {c for d in domains for c in d}
    if rest := sorted(wanted - seen):
        domains.append(rest)
    return domains


def _cpulist(text: str) -> set[int]:
    """The kernel's list format: ``0-3,8,10-11``."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out
