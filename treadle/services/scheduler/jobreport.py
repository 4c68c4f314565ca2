"""Reports what the scheduler knows onto its RolloutJob: reward demand and training progress.

Called by the scheduler's ``__main__`` on a tick (about every two seconds), not per request: each
changed value is one API patch (and, for the annotation, one reconcile of the job by the operator).

- **Reward demand**, the scoring requests waiting or in flight, goes to the job's
  ``treadle.dev/reward-demand`` annotation; the operator's update handler re-renders the reward
  gateway Deployment with ``ceil(demand / 32)`` replicas within ``[minReplicas, maxReplicas]`` (0
  when idle and scale-to-zero), see ``treadle.topology.reward_replicas``.
- **Progress**, what the trainer said with its latest ``CommitVersion`` (version, step, mean batch
  reward), goes to the job's status subresource as ``policyVersion``, ``step`` and ``meanReward``:
  the STEP, POLICY and REWARD printer columns.
- **The rollout**, the scheduler's own counts (completed, failed, aborted, pending, in flight),
  trajectories per minute since the last report, the most stale stored trajectory and the top
  reasons of failures, goes to the status's ``rollout`` every ``ROLLOUT_INTERVAL_S`` at most, for
  ``treadle status``. The operator never writes these fields
  (``treadle.operator.handlers._status_patch``), so the two writers never race on a field.

The pod runs as the job's ``<job>-scheduler`` ServiceAccount, whose Role allows ``patch`` on this
one RolloutJob and its status and nothing else. Outside a cluster (no ``TREADLE_JOB`` /
``TREADLE_NAMESPACE`` or no credentials) there is no reporter. API failures are logged and counted,
never raised: a value not written is tried again on the next tick.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import kubernetes
import urllib3

from treadle import kubeapi
from treadle.api import v1alpha1
from treadle.errors import SpecError
from treadle.services import podenv
from treadle.services.scheduler import protocol

log = logging.getLogger(__name__)
ROLLOUT_INTERVAL_S = 10.0
TOP_REASONS = 5


def rollout_progress(
    stats: protocol.Stats, *, max_staleness: int, per_minute: float
) -> v1alpha1.RolloutProgress:
    """The status's ``rollout`` from the scheduler's ``stats`` (reasons: the most frequent first)."""
    top = sorted(stats.failed_by_reason.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_REASONS]
    return v1alpha1.RolloutProgress(
        completed=stats.completed, failed=stats.failed, aborted=stats.aborted, pending=stats.pending,
        in_flight=stats.in_flight, trajectories_per_minute=round(max(0.0, per_minute), 2),
        max_staleness=max(0, max_staleness),
        failures=[v1alpha1.ReasonCount(reason=r[:200], count=n) for r, n in top],
    )  # fmt: skip


class JobReporter:
    """Writes reward demand and training progress onto the job; one request at a time, on change."""

    def __init__(self, client: kubeapi.Client, *, namespace: str, job: str) -> None:
        self._kube = client
        self.namespace = namespace
        self.job = job
        self._demand: int | None = None
        self._progress: protocol.Progress | None = None
        self._rollout: tuple[float, int] | None = None
        """When the rollout was last written, and how many trajectories had finished then."""
        self._lock = asyncio.Lock()
        self.patches = 0
        """Patches the API server accepted."""
        self.errors = 0
        """Patches that failed (logged; retried with the next changed or repeated value)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> JobReporter | None:
        """A reporter for ``$TREADLE_NAMESPACE/$TREADLE_JOB``; ``None`` outside a cluster."""
        found = podenv.job_api(environ)
        return None if found is None else cls(found[0], namespace=found[1], job=found[2])

    async def report_demand(self, pending: int) -> None:
        """Annotate the job with ``pending`` unless that is already the last value written."""
        if pending < 0:
            raise SpecError(f"must be >= 0, got {pending}", field="pending", value=pending)
        async with self._lock:
            if pending == self._demand:
                return
            annotations = {v1alpha1.REWARD_DEMAND_ANNOTATION: str(pending)}
            if await self._write(f"reward demand {pending}", self._kube.annotate_job, annotations):
                self._demand = pending

    async def report_progress(self, progress: protocol.Progress) -> None:
        """Write ``progress`` on the job's status unless it is already the last one written.

        Nothing is written before the first commit: version 0 is the job's initial status anyway.
        """
        async with self._lock:
            if progress == self._progress or progress.version == 0:
                return
            status: dict[str, Any] = {"policyVersion": progress.version, "step": progress.step}
            if progress.mean_reward is not None:
                status["meanReward"] = progress.mean_reward
            if await self._write(f"progress {status}", self._kube.patch_status, status):
                self._progress = progress

    async def report_rollout(self, stats: protocol.Stats, *, max_staleness: int, now: float) -> None:
        """Write the rollout section of the status (``rollout_progress``) at most every
        ``ROLLOUT_INTERVAL_S``; ``now`` is a monotonic clock's reading."""
        async with self._lock:
            finished = stats.completed + stats.failed + stats.aborted
            if self._rollout is not None and now - self._rollout[0] < ROLLOUT_INTERVAL_S:
                return
            rate = 0.0
            if self._rollout is not None and now > self._rollout[0]:
                rate = (finished - self._rollout[1]) * 60.0 / (now - self._rollout[0])
            body = rollout_progress(stats, max_staleness=max_staleness, per_minute=rate)
            status = {"rollout": body.model_dump(mode="json", by_alias=True)}
            if await self._write("rollout", self._kube.patch_status, status):
                self._rollout = (now, finished)

    async def _write(self, what: str, call: Callable[[str, str, Any], None], body: Any) -> bool:
        try:
            await asyncio.to_thread(call, self.namespace, self.job, body)
        except (kubernetes.client.ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            self.errors += 1
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.warning("%s not written on %s/%s: %s", what, self.namespace, self.job, why)
            return False
        self.patches += 1
        return True

    async def aclose(self) -> None:
        await asyncio.to_thread(self._kube.close)
