"""Reports the scheduler's reward demand on its RolloutJob, where the operator sizes the gateway.

Called by the scheduler's ``__main__`` with the number of scoring requests waiting or in flight,
on a tick (about once a second), not per request: each changed value is one API patch and one
reconcile of the job by the operator.
The value goes to the job's ``treadle.dev/reward-demand`` annotation (one merge patch, only when
it changed); the operator's update handler re-renders the reward gateway Deployment with
``ceil(demand / 32)`` replicas within ``[minReplicas, maxReplicas]`` (0 when idle and
scale-to-zero), see ``treadle.operator.render.backends.reward_replicas``.

The pod runs as the job's ``<job>-scheduler`` ServiceAccount, whose Role allows ``patch`` on this
one RolloutJob and nothing else. Outside a cluster (no ``TREADLE_JOB`` / ``TREADLE_NAMESPACE`` or
no credentials) there is no reporter. API failures are logged and counted, never raised: a lost
report only delays scaling until the next changed value.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

import kubernetes
import urllib3

from treadle import kubeapi
from treadle.api import v1alpha1
from treadle.errors import SpecError
from treadle.services import podenv

log = logging.getLogger(__name__)


class RewardDemandReporter:
    """Writes the pending scoring requests onto the job; one request at a time, only on change."""

    def __init__(self, client: kubeapi.Client, *, namespace: str, job: str) -> None:
        self._kube = client
        self.namespace = namespace
        self.job = job
        self._reported: int | None = None
        self._lock = asyncio.Lock()
        self.patches = 0
        """Annotation patches the API server accepted."""
        self.errors = 0
        """Patches that failed (logged; retried with the next changed or repeated value)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> RewardDemandReporter | None:
        """A reporter for ``$TREADLE_NAMESPACE/$TREADLE_JOB``; ``None`` outside a cluster."""
        found = podenv.job_api(environ)
        return None if found is None else cls(found[0], namespace=found[1], job=found[2])

    async def report(self, pending: int) -> None:
        """Annotate the job with ``pending`` unless that is already the last value written."""
        if pending < 0:
            raise SpecError(f"must be >= 0, got {pending}", field="pending", value=pending)
        async with self._lock:
            if pending == self._reported:
                return
            annotations = {v1alpha1.REWARD_DEMAND_ANNOTATION: str(pending)}
            try:
                await asyncio.to_thread(self._kube.annotate_job, self.namespace, self.job, annotations)
            except (kubernetes.client.ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
                self.errors += 1
                why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                log.warning(
                    "reward demand %d not reported on %s/%s: %s", pending, self.namespace, self.job, why
                )
                return
            self._reported = pending
            self.patches += 1

    async def aclose(self) -> None:
        await asyncio.to_thread(self._kube.close)
