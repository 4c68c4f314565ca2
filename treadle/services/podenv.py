"""What a service reads from the pod the operator renders: ``TREADLE_*`` variables and the job's ConfigMap.

Called by every service's ``__main__`` (flags override, these fill the rest) and by the unit tests.
``treadle.operator.render`` writes the variables (``_env`` and each component's extras) and mounts
the ConfigMap at ``/etc/treadle`` (``job.json`` is the validated spec, ``endpoints.json`` the
in-cluster addresses). The job's spec becomes scheduler, placement and buffer configs through
``treadle.localmode.plan.job_config``, the same translation local mode uses; only the counts a
cluster decides differently are chosen here. Anything missing or malformed raises ``SpecError``
naming the variable (and, for the job, the field inside it), so a pod fails at startup with the
reason in its log instead of running half-configured.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import socket
import sys
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NoReturn, TypeVar

from treadle import errors
from treadle.api import env_vars, v1alpha1
from treadle.localmode import plan
from treadle.services.scheduler import protocol as scheduler_protocol

ENGINE_MAX_NUM_SEQS = 256
"""vLLM's default ``--max-num-seqs``: sequences one inference replica runs at once."""

T = TypeVar("T")


def pick(flag_value: str | None, environ: Mapping[str, str], var: str, *, flag: str) -> str:
    """The flag if given, else the variable; neither raises ``SpecError`` naming both."""
    if flag_value:
        return flag_value
    value = environ.get(var, "")
    if not value:
        raise errors.SpecError(f"not set: pass {flag} or set {var}", field=var)
    return value


def integer(environ: Mapping[str, str], var: str, *, minimum: int = 0) -> int | None:
    """An integer variable, or None when unset."""
    raw = environ.get(var, "")
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise errors.SpecError(f"must be an integer, got {raw!r}", field=var, value=raw) from None
    if value < minimum:
        raise errors.SpecError(f"must be >= {minimum}", field=var, value=value)
    return value


def load_job(environ: Mapping[str, str]) -> v1alpha1.RolloutJob:
    """The job from ``TREADLE_CONFIG`` (its spec) plus ``TREADLE_JOB``/``TREADLE_NAMESPACE``."""
    path = environ.get(env_vars.CONFIG, "")
    if not path:
        raise errors.SpecError("not set: the path of the job's spec (job.json of the job's ConfigMap)",
                               field=env_vars.CONFIG)  # fmt: skip
    try:
        raw = json.loads(Path(path).read_text())
    except OSError as exc:
        raise errors.SpecError(
            f"cannot read {path}: {exc.strerror}", field=env_vars.CONFIG, value=path
        ) from exc
    except ValueError as exc:
        raise errors.SpecError(f"{path} is not JSON: {exc}", field=env_vars.CONFIG, value=path) from exc
    if not isinstance(raw, dict):
        raise errors.SpecError(f"{path} must hold a JSON object (the job's spec)", field=env_vars.CONFIG)
    try:
        spec = v1alpha1.parse_spec(raw)
    except errors.SpecError as exc:
        raise errors.SpecError(str(exc), field=f"{env_vars.CONFIG}:{exc.field}", value=exc.value) from exc
    name = environ.get(env_vars.JOB, "")
    if not name:
        raise errors.SpecError("not set: the job's name", field=env_vars.JOB)
    return v1alpha1.RolloutJob(
        metadata={"name": name, "namespace": environ.get(env_vars.NAMESPACE, "default")}, spec=spec
    )


class Job:
    """The job's configs, loaded on first use: a service given every flag never reads the ConfigMap."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ
        self._config: plan.JobConfig | None = None

    @property
    def config(self) -> plan.JobConfig:
        if self._config is None:
            self._config = job_config(self.environ)
        return self._config

    @property
    def present(self) -> bool:
        """Whether the pod names a job config at all (local mode passes flags instead)."""
        return bool(self.environ.get(env_vars.CONFIG))


def job_config(environ: Mapping[str, str]) -> plan.JobConfig:
    """The job's service configs as a cluster runs them, with the operator's per-service overrides.

    Counts a cluster decides: default tokens per turn and in-flight window (the scheduler's own
    defaults), and generations at once = replicas x vLLM's default ``max_num_seqs``.
    """
    job = load_job(environ)
    defaults = scheduler_protocol.Settings()
    cfg = plan.job_config(
        job,
        max_tokens=scheduler_protocol.TaskConfig(name="", env="").max_tokens,
        max_in_flight=defaults.max_in_flight,
        max_concurrent_generations=max(1, sum(p.replicas for p in job.spec.pools)) * ENGINE_MAX_NUM_SEQS,
    )
    # The operator renders these from the same spec; a hand-edited Deployment may change them.
    alpha = integer(environ, env_vars.STALENESS)
    batch_size = integer(environ, env_vars.BATCH_SIZE, minimum=1)
    settings = dataclasses.replace(
        cfg.settings,
        alpha=cfg.settings.alpha if alpha is None else alpha,
        batch_size=cfg.settings.batch_size if batch_size is None else batch_size,
        scheduling_policy=environ.get(env_vars.SCHEDULING_POLICY) or cfg.settings.scheduling_policy,
    )
    return dataclasses.replace(
        cfg,
        settings=settings,
        alpha=settings.alpha,
        batch_size=settings.batch_size,
        placement_policy=environ.get(env_vars.PLACEMENT_POLICY) or cfg.placement_policy,
    )


def advertised_host(bind_host: str) -> str:
    """The address peers dial for a server bound to ``bind_host``: a wildcard means this pod's IP."""
    if bind_host not in ("0.0.0.0", "::", ""):
        return bind_host
    # The kubelet writes the pod's IP for its hostname into /etc/hosts.
    return socket.gethostbyname(socket.gethostname())


def peer_url(url: str, *, beside: str) -> str:
    """``url`` as another pod dials it: a loopback host becomes the host of ``beside``.

    The agent reaches its engine at ``127.0.0.1`` (both containers share the pod's network) but
    placement, in another pod, must dial the pod's IP, which the agent already advertises in its
    own URL (``beside``); vLLM binds ``0.0.0.0``, so the engine answers there too.
    """
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        return url
    peer = urllib.parse.urlsplit(beside).hostname or ""
    if not peer:
        raise errors.SpecError("must be an http(s)://host[:port] URL", field="beside", value=beside)
    netloc = f"[{peer}]" if ":" in peer else peer
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def or_exit(build: Callable[[], T], *, prog: str) -> T:
    """``build()``, or exit 2 with one line naming the variable/field when the config is bad."""
    try:
        return build()
    except errors.SpecError as exc:
        _exit(prog, str(exc))


def _exit(prog: str, message: str) -> NoReturn:
    print(f"{prog}: configuration error: {message}", file=sys.stderr)
    raise SystemExit(2)
