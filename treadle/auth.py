"""Per-job bearer tokens: what a job's servers require and its clients send (``docs/SECURITY.md``).

Every gRPC server (``treadle.services.grpcutil.server``) and every HTTP app
(``treadle.services.httputil.app``) of a job refuses a call whose ``authorization`` header is not
``Bearer <the job's token>``; the health checks and ``/metrics`` stay open for the kubelet and
Prometheus. The token reaches a process through ``TREADLE_TOKEN_FILE`` (the job's Secret, mounted
by the operator; the file local mode and ``podenv.job_env`` write) or, for a trainer outside the
cluster, ``TREADLE_TOKEN``.

The operator derives a job's token from its own key and the job's uid (``job_secret``), so
rendering stays a pure function of (job, operator config) and a re-created job gets a new token.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from pathlib import Path

from treadle import errors
from treadle.api import env_vars

HEADER = "authorization"
"""gRPC metadata key and HTTP header (gRPC wants lowercase keys; HTTP headers ignore case)."""
SCHEME = "Bearer"
TOKEN_KEY = "token"
"""Key of the token in the job's Secret."""
REDIS_PASSWORD_KEY = "redis-password"
"""Key of the job's Redis password in the job's Secret."""


def new_token() -> str:
    """A fresh random token (256 bits): local mode's, one per run."""
    return secrets.token_urlsafe(32)


def job_secret(key: str, *, namespace: str, name: str, uid: str, purpose: str) -> str:
    """A job's secret for ``purpose`` (``TOKEN_KEY``, ``REDIS_PASSWORD_KEY``): HMAC-SHA256 of the
    job's identity under the operator's key, so nobody without the key can compute it."""
    message = f"{purpose}\0{namespace}\0{name}\0{uid}".encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


def redis_key_patterns(prefix: str) -> list[str]:
    """The Redis keys of the job whose key prefix is ``prefix`` (``<namespace>/<job>/<uid>``), as ACL globs:
    the buffer's (``buffer.redis_store``), the feeder's (``feeder.store``), the DARTS statistics
    (``scheduler.darts_store``), the scheduler's journal (``scheduler.journal``) and the API quotas
    (``env.quotas``). Kubernetes names hold none of
    ``*?[]\\{}``, so no job's prefix is a glob matching another's."""
    return [
        *(f"treadle:{kind}:{{{prefix}}}:*" for kind in ("buf", "feed", "darts", "sched")),
        f"{prefix}:tangram:*",
    ]


def header_value(token: str) -> str:
    return f"{SCHEME} {token}"


def refusal(presented: str | None, token: str) -> str | None:
    """None if ``presented`` (the ``authorization`` header) carries ``token``, else why not."""
    if not presented:
        return f"missing {HEADER} header: send '{SCHEME} <the job's token>' (its Secret's {TOKEN_KEY})"
    scheme, _, value = presented.partition(" ")
    if scheme.lower() != SCHEME.lower() or not value:
        return f"{HEADER} header must be '{SCHEME} <token>'"
    if not hmac.compare_digest(value.strip().encode(), token.encode()):
        return f"the {HEADER} token is not this job's"
    return None


def write_token(directory: Path, token: str) -> Path:
    """Write ``token`` as ``directory/token``, readable by its owner only; its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / TOKEN_KEY
    path.touch(mode=0o600)
    path.write_text(token)
    return path


def read_secret(environ: Mapping[str, str], file_var: str, *, value_var: str | None = None) -> str | None:
    """The secret in the file ``file_var`` names (or, given, the ``value_var`` variable itself);
    None if neither is set. A named file that is unreadable or empty raises ``SpecError``."""
    if value_var is not None and environ.get(value_var):
        return environ[value_var].strip()
    path = environ.get(file_var, "")
    if not path:
        return None
    try:
        value = Path(path).read_text().strip()
    except OSError as exc:
        raise errors.SpecError(f"cannot read {path}: {exc.strerror}", field=file_var, value=path) from exc
    if not value:
        raise errors.SpecError(f"{path} is empty", field=file_var, value=path)
    return value


def token_from(environ: Mapping[str, str]) -> str | None:
    """The job's token from ``TREADLE_TOKEN`` or the file ``TREADLE_TOKEN_FILE`` names; None if unset."""
    return read_secret(environ, env_vars.TOKEN_FILE, value_var=env_vars.TOKEN)
