"""Connect a trainer to its RolloutJob: the buffer, scheduler, placement and weight store, found in the
pod's environment or given.

A trainer the operator runs for the job (``spec.trainer``; ``treadle.operator.render.trainer``) has
every address in its environment, under the names of ``treadle.api.env_vars``:

==========================  =====================================================================
``TREADLE_BUFFER_ADDR``     buffer gRPC ``host:port``: ``get_batch`` / ``ack`` (``Connection.batches``)
``TREADLE_SCHEDULER_ADDR``  scheduler gRPC: ``suspend`` / ``resume`` around a swap, ``commit_version``
``TREADLE_PLACEMENT_ADDR``  placement gRPC: the registered inference workers (and their swaps)
``TREADLE_WEIGHTS_PREFIX``  the job's key prefix in the store (a multi-agent job's agent: plus
                            ``TREADLE_WEIGHTS_AGENT``)
``TREADLE_WEIGHTS_DIR``     a ``weights.store: local`` job's directory, or else
``TREADLE_WEIGHTS_MASTER``  the Mooncake master and ``TREADLE_WEIGHTS_METADATA`` its metadata URL
``TREADLE_TOKEN_FILE``      the job's token (its Secret ``<job>-auth``, mounted): every service of
                            the job refuses calls without it; outside the cluster ``TREADLE_TOKEN``
                            holds the token itself (``docs/SECURITY.md`` says how to get it)
==========================  =====================================================================

so in the job::

    conn = connect.connect(keep_versions=alpha + 1)
    async for batch in conn.batches(batch_size=64, max_batches=steps):
        ...                                                  # train on batch
        published = await conn.publisher.publish(model.state_dict())
        await conn.scheduler.suspend()
        ...                                                  # swap it into every engine
        await conn.publisher.commit(published.version, step=step, mean_reward=reward)
        await conn.scheduler.resume()
    await conn.aclose()

A trainer outside the job gives the same things as arguments::

    conn = connect.connect(connect.Endpoints.from_env(
        {}, scheduler="10.0.0.5:50051", buffer="10.0.0.6:50053", placement="10.0.0.7:50052",
        weights_dir="/mnt/weights", weights_prefix="team-a/math-tool",  # or weights_master=, _metadata=
        token=os.environ["TREADLE_TOKEN"],  # kubectl get secret math-tool-auth ... (docs/SECURITY.md)
    ))

(``from_env(os.environ, ...)``: an argument wins over its variable); a missing one raises
``SpecError`` naming both. Call it from the event loop that will use the connection (its gRPC
channels belong to that loop).

A trainer pod may start before the job's services answer (their Services' DNS names not resolving
yet, their pods not ready): ``wait_for`` makes its first call to one with a bounded backoff and logs
what it waits for, instead of failing and leaving its restart to the Job's backoff.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Literal, TypeVar

from treadle import auth, errors
from treadle.api import env_vars
from treadle.client import batches as batches_mod
from treadle.client import publisher as publisher_mod
from treadle.client import retrying
from treadle.services.buffer import client as buffer_client
from treadle.services.placement import client as placement_client
from treadle.services.scheduler import client as scheduler_client
from treadle.weights import loader, publish

log = logging.getLogger(__name__)
T = TypeVar("T")
BUCKET_BYTES = 64 << 20
"""Bucket size of published versions: large enough that per-object overhead vanishes, small enough
that a small model is not one bucket padded to a gigabyte."""


@dataclasses.dataclass(frozen=True)
class Endpoints:
    """Where the job's services and its weight store are (``from_env`` reads the pod's variables)."""

    scheduler: str
    buffer: str
    placement: str
    weights: dict[str, str]
    """The weight-store variables (``loader.store_from_env`` reads them)."""
    token: str | None = None
    """The job's token (``treadle.auth``), sent on every call; None only for services without one."""

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str],
        *,
        scheduler: str | None = None,
        buffer: str | None = None,
        placement: str | None = None,
        weights_dir: str | None = None,
        weights_master: str | None = None,
        weights_metadata: str | None = None,
        weights_prefix: str | None = None,
        token: str | None = None,
    ) -> Endpoints:
        """Each given value, else its variable; ``SpecError`` names what is missing."""

        def pick(value: str | None, var: str, arg: str) -> str:
            got = value or environ.get(var, "")
            if not got:
                raise errors.SpecError(f"not set: pass {arg}= or set {var}", field=var)
            return got

        given = {
            env_vars.WEIGHTS_DIR: weights_dir,
            env_vars.WEIGHTS_MASTER: weights_master,
            env_vars.WEIGHTS_METADATA: weights_metadata,
            env_vars.WEIGHTS_PREFIX: weights_prefix,
        }
        names = (*given, env_vars.WEIGHTS_AGENT, env_vars.WEIGHTS_REPLICAS)
        weights = {k: v for k, v in environ.items() if k in names}
        if weights_dir or weights_master:  # a store given as arguments replaces the pod's
            for var in (env_vars.WEIGHTS_DIR, env_vars.WEIGHTS_MASTER, env_vars.WEIGHTS_METADATA):
                weights.pop(var, None)
        weights |= {k: v for k, v in given.items() if v}
        return cls(
            scheduler=pick(scheduler, env_vars.SCHEDULER_ADDR, "scheduler"),
            buffer=pick(buffer, env_vars.BUFFER_ADDR, "buffer"),
            placement=pick(placement, env_vars.PLACEMENT_ADDR, "placement"),
            weights=weights,
            token=token or auth.token_from(environ),
        )


class Connection:
    """The job's services as a trainer uses them; ``aclose`` closes every channel and the store."""

    def __init__(self, endpoints: Endpoints, *, keep_versions: int, replicas: int | None) -> None:
        if keep_versions < 1:
            raise errors.SpecError("must be >= 1", field="keep_versions", value=keep_versions)
        store, prefix = loader.store_from_env(endpoints.weights, replicas=replicas)
        self.endpoints = endpoints
        self.scheduler = scheduler_client.SchedulerClient(endpoints.scheduler, token=endpoints.token)
        self.buffer = buffer_client.BufferClient(endpoints.buffer, token=endpoints.token)
        self.placement = placement_client.PlacementClient(endpoints.placement, token=endpoints.token)
        self.weights = publish.Publisher(
            store, prefix, bucket_bytes=BUCKET_BYTES, staleness_window=keep_versions - 1
        )
        self.publisher = publisher_mod.Publisher(self.weights, committer=self.scheduler)
        """Publishes versions to the store the engines pull from and commits them at the scheduler."""

    def batches(
        self,
        *,
        batch_size: int,
        timeout_s: float = 300.0,
        max_batches: int | None = None,
        acks: Literal["on_next", "explicit"] = "on_next",
    ) -> batches_mod.Batches:
        """Batches at the version this connection's publisher committed last (``acks``: ``Batches``')."""
        return batches_mod.Batches(
            self.buffer,
            batch_size=batch_size,
            version=lambda: self.publisher.committed,
            timeout_s=timeout_s,
            max_batches=max_batches,
            acks=acks,
        )

    async def aclose(self) -> None:
        await self.scheduler.aclose()
        await self.buffer.aclose()
        await self.placement.aclose()
        self.weights.store.close()


def connect(
    endpoints: Endpoints | None = None,
    *,
    keep_versions: int = 2,
    replicas: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> Connection:
    """A connection to the job at ``endpoints``; unset: all found in the pod's environment
    (``environ``, default ``os.environ``).

    ``keep_versions``: versions the store keeps (the staleness bound plus one, so that no engine
    pulls a deleted one); ``replicas``: copies of each version in a Mooncake store (the job's
    ``spec.weights.replicas``; unset: ``TREADLE_WEIGHTS_REPLICAS`` or 2).
    """
    if endpoints is None:
        endpoints = Endpoints.from_env(os.environ if environ is None else environ)
    return Connection(endpoints, keep_versions=keep_versions, replicas=replicas)


wait_for = retrying.wait_for
