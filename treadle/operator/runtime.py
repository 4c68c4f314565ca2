"""State the operator's handlers share (kopf's ``memo``): clients, config, metrics, caches.

Created by ``treadle operator run`` (``treadle.operator.cli``) and handed to ``kopf.run`` as the
memo; used from kopf's handler threads, hence the lock. kopf gives each object a shallow copy of
the memo, so all mutable shared state sits in containers created once (dicts, sets). No kopf
import: unit-testable alone.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from treadle.api import v1alpha1
from treadle.operator import config, kube, metrics

JobKey = tuple[str, str]
CAPACITY_TTL_S = 30.0


@dataclass
class Runtime:
    """What every handler shares; passed to kopf as ``memo``."""

    kube: kube.Kube
    cfg: config.OperatorConfig
    kubeconfig: str | None
    metrics: metrics.OperatorMetrics
    metrics_port: int | None = None
    metrics_addr: str = "0.0.0.0"
    # The status each job was last given by us: two refreshes racing on a stale index must not
    # both report the same transition as an Event.
    # Keyed by name but stamped with (uid, generation): a job deleted and re-created under the
    # same name must never inherit its predecessor's status.
    last_status: dict[JobKey, tuple[str, int, v1alpha1.RolloutJobStatus]] = field(default_factory=dict)
    # Single flight per job: a burst of pod events runs at most one refresh at a time and one
    # more after it, instead of one per event (each holding a worker thread).
    _refreshing: set[JobKey] = field(default_factory=set)
    _dirty: set[JobKey] = field(default_factory=set)
    reconciling: set[JobKey] = field(default_factory=set)
    _guard: threading.Lock = field(default_factory=threading.Lock)
    _http: Any = None
    keeper: Any = None
    """The ``redisacl.UserKeeper`` while the operator runs with the chart's Redis password."""
    # GPU capacity by accelerator class, listed at most every CAPACITY_TTL_S. Not a node watch:
    # every node's heartbeat would wake the operator, and on a large cluster the node workers
    # would crowd out the job workers.
    _capacity: dict[str, Any] = field(default_factory=dict)

    def gpu_capacity(self) -> dict[str, int]:
        # kopf hands each object a *shallow copy* of the memo, so every piece of shared state
        # lives in a mutable container created once (here a dict), never in a plain attribute.
        with self._guard:
            now = time.monotonic()
            if "at" not in self._capacity or now - self._capacity["at"] > CAPACITY_TTL_S:
                self._capacity.update(at=now, gpus=self.kube.gpu_capacity())
            gpus: dict[str, int] = self._capacity["gpus"]
            return gpus

    def begin_refresh(self, key: JobKey) -> bool:
        """True if the caller should refresh now; False if a running refresh will redo it."""
        with self._guard:
            if key in self._refreshing:
                self._dirty.add(key)
                return False
            self._refreshing.add(key)
            return True

    def refresh_again(self, key: JobKey, *, failed: bool = False) -> bool:
        """After one refresh: True if events arrived meanwhile and it must run once more."""
        with self._guard:
            if key in self._dirty and not failed:
                self._dirty.discard(key)
                return True
            self._dirty.discard(key)
            self._refreshing.discard(key)
            return False

    def known_jobs(self) -> list[tuple[str, str, str]]:
        """``(namespace, name, uid)`` of every job given a status since the operator started."""
        with self._guard:
            return [(ns, name, uid) for (ns, name), (uid, _, _) in self.last_status.items()]

    def forget(self, key: JobKey, uid: str) -> None:
        """Drop the deleted job ``key`` of ``uid``; a job re-created under the name (another uid) stays."""
        with self._guard:
            if key in self.last_status and self.last_status[key][0] == uid:
                del self.last_status[key]
