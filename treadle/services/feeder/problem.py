"""Says on the job why the feeder cannot feed, and takes it back once it can.

Called by the feeder's ``__main__`` when a dataset cannot be read (the ``SpecError`` message names
``spec.tasks[i].dataset...``) and again after it reads them all. The message goes to the job's
``treadle.dev/feeder-problem`` annotation (``v1alpha1.FEEDER_PROBLEM_ANNOTATION``), which the operator
turns into ``Degraded`` with reason ``DatasetUnusable``; removing it clears that. The pod runs as the
job's ``<job>-feeder`` ServiceAccount, whose Role allows ``patch`` on this one RolloutJob. API failures
are logged, never raised: the feeder says it again on its next attempt.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

import kubernetes
import urllib3

from treadle import kubeapi
from treadle.api import v1alpha1
from treadle.services import podenv

log = logging.getLogger(__name__)


class ProblemReporter:
    """Writes (or removes) the feeder's problem on its job."""

    def __init__(self, client: kubeapi.Client, *, namespace: str, job: str) -> None:
        self._kube, self.namespace, self.job = client, namespace, job

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ProblemReporter | None:
        """A reporter for ``$TREADLE_NAMESPACE/$TREADLE_JOB``; ``None`` outside a cluster."""
        found = podenv.job_api(environ)
        return None if found is None else cls(found[0], namespace=found[1], job=found[2])

    async def report(self, problem: str | None) -> bool:
        """Put ``problem`` on the job (None removes it); whether the API server took it."""
        annotations = {v1alpha1.FEEDER_PROBLEM_ANNOTATION: problem}
        try:
            await asyncio.to_thread(self._kube.annotate_job, self.namespace, self.job, annotations)
        except (kubernetes.client.ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.warning("feeder problem not written on %s/%s: %s", self.namespace, self.job, why)
            return False
        return True

    async def aclose(self) -> None:
        await asyncio.to_thread(self._kube.close)
