"""Each job's own Redis user, restricted to its own keys: created (or reset) on every reconcile, deleted
with the job, and so are its keys. Called by ``treadle.operator.handlers`` with the shared Redis's
admin password (``OperatorConfig.redis_password``, the chart's Secret).

The user is named after the job's key prefix (``<namespace>/<job>``); its password is the job's
Secret's ``redis-password`` (``render.security``), which the job's pods read
(``TREADLE_REDIS_PASSWORD_FILE``, ``services.podenv.redis_url``). Its keys are
``auth.redis_key_patterns``; it has no Pub/Sub channel and none of the ``@admin`` and ``@dangerous``
commands (``KEYS``, ``FLUSHALL``, ``CONFIG``, ``ACL``, ...), so one job can neither read nor wipe
another's experience, nor list its keys.
"""

from __future__ import annotations

import redis

from treadle import auth
from treadle.api import v1alpha1
from treadle.operator import config


def user(job: v1alpha1.RolloutJob) -> str:
    return f"{job.namespace}/{job.name}"


def rules(job: v1alpha1.RolloutJob, password: str) -> list[str]:
    """``ACL SETUSER`` rules of the job's user: ``reset`` first, so a rerun leaves exactly these."""
    patterns = [f"~{p}" for p in auth.redis_key_patterns(user(job))]
    return ["reset", "on", f">{password}", *patterns, "resetchannels", "+@all", "-@admin", "-@dangerous"]


def _admin(cfg: config.OperatorConfig) -> redis.Redis:
    return redis.Redis.from_url(cfg.redis_url, password=cfg.redis_password, protocol=2, socket_timeout=10)


def ensure_user(cfg: config.OperatorConfig, job: v1alpha1.RolloutJob, password: str) -> None:
    """Create or reset the job's user (idempotent: every reconcile calls it)."""
    with _admin(cfg) as admin:
        admin.execute_command("ACL", "SETUSER", user(job), *rules(job, password))


def delete_user(cfg: config.OperatorConfig, namespace: str, name: str) -> None:
    with _admin(cfg) as admin:
        admin.execute_command("ACL", "DELUSER", f"{namespace}/{name}")


def delete_keys(cfg: config.OperatorConfig, namespace: str, name: str) -> int:
    """Delete every key of the deleted job (its trajectories, feeder positions, scheduler journal, DARTS
    statistics, API quotas); returns how many. A job re-created under the name then starts afresh
    instead of taking up the old one's position, groups and committed version."""
    deleted = 0
    with _admin(cfg) as admin:
        for pattern in auth.redis_key_patterns(f"{namespace}/{name}"):
            batch: list[bytes] = []
            for key in admin.scan_iter(match=pattern, count=1000):
                batch.append(key)
                if len(batch) == 1000:
                    deleted += int(admin.unlink(*batch))
                    batch.clear()
            if batch:
                deleted += int(admin.unlink(*batch))
    return deleted
