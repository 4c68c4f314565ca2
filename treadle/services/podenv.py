"""What a service reads from the pod the operator renders: ``TREADLE_*`` variables and the job file.

Called by every service's ``__main__`` (a flag gives an address or a count the job does not hold;
no flag repeats a job setting) and by the unit tests. ``treadle.operator.render`` writes the
variables (``common.pod_env`` and each pod's identity) and mounts the ConfigMap at ``/etc/treadle``
(``job.json`` is the validated spec, ``endpoints.json`` the in-cluster addresses); local mode,
``treadle train``, benchmarks and tests write the same ``job.json`` (``job_env``) and set the same
variables.
The spec becomes every service's config through ``treadle.api.jobconfig.job_config``; only the
counts a cluster decides are chosen here. No variable repeats a spec field: the job file is the one
source of a job setting. Anything missing or malformed raises ``SpecError`` naming the variable
(and, for the job, the field inside it), so a pod fails at startup with the reason in its log
instead of running half-configured.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import logging
import socket
import sys
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NoReturn, TypeVar

import kubernetes
import prometheus_client

from treadle import auth, errors, kubeapi
from treadle.api import env_vars, jobconfig, v1alpha1

log = logging.getLogger(__name__)

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


def job_env(job: v1alpha1.RolloutJob, directory: Path, *, token: str | None = None) -> dict[str, str]:
    """Write ``job``'s job file into ``directory``; the variables a process then reads it by.

    ``token``: the run's token (``auth.new_token()``), written beside it as the operator mounts the
    job's Secret; every server then requires it and every client the process builds sends it."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "job.json"
    path.write_text(jobconfig.job_file(job))
    out = {env_vars.CONFIG: str(path), env_vars.JOB: job.name}
    if token is not None:
        out[env_vars.TOKEN_FILE] = str(auth.write_token(directory / "auth", token))
    return out


def redis_url(environ: Mapping[str, str], given: str | None = None) -> str:
    """``given`` (else ``TREADLE_REDIS_URL``, else empty: no Redis) with the job's Redis user and
    password when the pod has them (``TREADLE_REDIS_PASSWORD_FILE``; the user is the key prefix,
    ``treadle.operator.redisacl``); unchanged without them, or when the URL names a user itself."""
    url = given if given is not None else environ.get(env_vars.REDIS_URL, "")
    password = auth.read_secret(environ, env_vars.REDIS_PASSWORD_FILE)
    parts = urllib.parse.urlsplit(url)
    if not url or password is None or parts.username or parts.password:
        return url
    user = environ.get(env_vars.KEY_PREFIX, "")
    if not user:
        raise errors.SpecError("not set: the job's key prefix, its Redis user", field=env_vars.KEY_PREFIX)
    quote = functools.partial(urllib.parse.quote, safe="")
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{quote(user)}:{quote(password)}@{parts.netloc}"))


def token(environ: Mapping[str, str]) -> str | None:
    """The job's token (``TREADLE_TOKEN_FILE``): servers require it, clients send it. None outside
    a job (an env or reward server run alone): the server then accepts every caller, and says so."""
    found = auth.token_from(environ)
    if found is None:
        log.warning("%s not set: this process neither requires nor sends a job token", env_vars.TOKEN_FILE)
    return found


class Job:
    """The job's configs, loaded on first use: the env and reward servers run without a job too.

    The counts are the caller's (local mode passes its own); None takes the cluster's (``job_config``).
    """

    def __init__(
        self, environ: Mapping[str, str], *, max_tokens: int | None = None, max_in_flight: int | None = None,
        max_concurrent_generations: int | None = None,
    ) -> None:  # fmt: skip
        self.environ = environ
        self.counts = (max_tokens, max_in_flight, max_concurrent_generations)
        self._config: jobconfig.JobConfig | None = None

    @property
    def config(self) -> jobconfig.JobConfig:
        if self._config is None:
            tokens, in_flight, generations = self.counts
            self._config = job_config(
                self.environ,
                max_tokens=tokens,
                max_in_flight=in_flight,
                max_concurrent_generations=generations,
            )
        return self._config

    @property
    def present(self) -> bool:
        """Whether the pod names a job file at all (an env or reward server may run without one)."""
        return bool(self.environ.get(env_vars.CONFIG))


def job_config(
    environ: Mapping[str, str],
    *,
    max_tokens: int | None = None,
    max_in_flight: int | None = None,
    max_concurrent_generations: int | None = None,
) -> jobconfig.JobConfig:
    """The job's service configs from its job file, with the counts a cluster decides unless given.

    A cluster's counts: the scheduler's own defaults for tokens per turn and the in-flight window,
    and generations at once = replicas x vLLM's default ``max_num_seqs``.
    """
    job = load_job(environ)
    replicas = max(1, sum(p.replicas for p in job.spec.pools))
    return jobconfig.job_config(
        job,
        max_tokens=jobconfig.TaskConfig(name="", env="").max_tokens if max_tokens is None else max_tokens,
        max_in_flight=jobconfig.Settings().max_in_flight if max_in_flight is None else max_in_flight,
        max_concurrent_generations=replicas * ENGINE_MAX_NUM_SEQS
        if max_concurrent_generations is None
        else max_concurrent_generations,
    )


def job_api(environ: Mapping[str, str]) -> tuple[kubeapi.Client, str, str] | None:
    """(API client, namespace, job name) of a pod that may write on its own job; None outside a cluster.

    None without ``TREADLE_JOB`` / ``TREADLE_NAMESPACE`` or without credentials (a pod rendered with
    no ServiceAccount token); the scheduler and the feeder then report nothing on the job.
    """
    job, namespace = environ.get(env_vars.JOB), environ.get(env_vars.NAMESPACE)
    if not job or not namespace:
        return None
    try:
        client = kubeapi.Client.from_environment(pool_size=1, environ=environ)
    except (kubernetes.config.ConfigException, OSError) as exc:
        log.info("no Kubernetes credentials (%s): nothing is reported on the job", exc)
        return None
    return client, namespace, job


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


def metrics_port(environ: Mapping[str, str], flag: int | None = None) -> int:
    """The flag if given, else ``$TREADLE_METRICS_PORT`` (the pod's ``metrics`` port); 0 when
    neither is set: no /metrics server."""
    if flag is not None:
        return flag
    raw = environ.get(env_vars.METRICS_PORT, "")
    if not raw:
        return 0
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise errors.SpecError("must be a TCP port, 1-65535", field=env_vars.METRICS_PORT, value=raw)
    return int(raw)


def serve_metrics(registry: prometheus_client.CollectorRegistry, host: str, port: int) -> None:
    """Serve ``registry`` at ``http://host:port/metrics`` from a thread (``port`` 0: nothing).

    Apart from a service's own port so that every pod of a job is scraped alike, on its ``metrics``
    port, whatever the service speaks (gRPC cannot answer a scrape).
    """
    if port:
        prometheus_client.start_http_server(port, addr=host, registry=registry)


def or_exit(build: Callable[[], T], *, prog: str) -> T:
    """``build()``, or exit 2 with one line naming the variable/field when the config is bad."""
    try:
        return build()
    except errors.SpecError as exc:
        _exit(prog, str(exc))


def _exit(prog: str, message: str) -> NoReturn:
    print(f"{prog}: configuration error: {message}", file=sys.stderr)
    raise SystemExit(2)
