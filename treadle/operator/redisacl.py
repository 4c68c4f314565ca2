"""Each job's own Redis user, restricted to its own keys: created (or reset) on every reconcile, deleted
with the job, and so are its keys. Called by ``treadle.operator.handlers`` with the shared Redis's
admin password (``OperatorConfig.redis_password``, the chart's Secret).

The user is named after the job's key prefix (``<namespace>/<job>/<uid>``, ``render.common.job_prefix``:
deleting a job's user and keys never touches a job re-created under its name); its password is the job's
Secret's ``redis-password`` (``render.security``), which the job's pods read
(``TREADLE_REDIS_PASSWORD_FILE``, ``services.podenv.redis_url``). Its keys are
``auth.redis_key_patterns``; it has no Pub/Sub channel and none of the ``@admin`` and ``@dangerous``
commands (``KEYS``, ``FLUSHALL``, ``CONFIG``, ``ACL``, ...), so one job can neither read nor wipe
another's experience, nor list its keys.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

import redis

from treadle import auth
from treadle.api import v1alpha1
from treadle.operator import config
from treadle.operator.render import common as render_common

log = logging.getLogger(__name__)


def user(job: v1alpha1.RolloutJob) -> str:
    return render_common.prefix_of(job)


def rules(name: str, password: str) -> list[str]:
    """``ACL SETUSER`` rules of the job user ``name`` (``user``): ``reset`` first, so a rerun leaves
    exactly these."""
    patterns = [f"~{p}" for p in auth.redis_key_patterns(name)]
    return ["reset", "on", f">{password}", *patterns, "resetchannels", "+@all", "-@admin", "-@dangerous"]


def _admin(cfg: config.OperatorConfig) -> redis.Redis:
    return redis.Redis.from_url(cfg.redis_url, password=cfg.redis_password, protocol=2, socket_timeout=10)


def ensure_user(cfg: config.OperatorConfig, job: v1alpha1.RolloutJob, password: str) -> None:
    """Create or reset the job's user (idempotent: every reconcile calls it)."""
    with _admin(cfg) as admin:
        admin.execute_command("ACL", "SETUSER", user(job), *rules(user(job), password))


class UserKeeper:
    """Puts the jobs' users back when Redis restarted: ``ACL SETUSER`` lives in Redis's memory only (the
    AOF replays data, not users), so a restarted Redis would refuse every job's pods until their
    next reconcile. Every ``interval_s`` it reads Redis's ``run_id`` (new on every start) and, when it
    changed, sets up the user of every job ``jobs()`` names, as ``(namespace, name, uid)``.

    Run by the operator on a thread of its own (``start``); ``check`` is one round, for tests."""

    def __init__(
        self,
        cfg: config.OperatorConfig,
        jobs: Callable[[], Iterable[tuple[str, str, str]]],
        *,
        interval_s: float = 5.0,
    ) -> None:
        self.cfg, self.jobs, self.interval_s = cfg, jobs, interval_s
        self.run_id: str | None = None
        self.restored = 0
        """Users set up again after Redis restarts, in all."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> int:
        """One round; returns how many users it set up again (0 while Redis runs on)."""
        with _admin(self.cfg) as admin:
            run_id = str(admin.info("server")["run_id"])
            if run_id == self.run_id:
                return 0
            if self.run_id is None:
                # The operator just started: every job is reconciled, its user set up, anyway.
                self.run_id = run_id
                return 0
            count = 0
            for namespace, name, uid in self.jobs():
                password = auth.job_secret(
                    self.cfg.auth_key,
                    purpose=auth.REDIS_PASSWORD_KEY,
                    namespace=namespace,
                    name=name,
                    uid=uid,
                )
                name_of_user = render_common.job_prefix(namespace, name, uid)
                admin.execute_command("ACL", "SETUSER", name_of_user, *rules(name_of_user, password))
                count += 1
            # Only now: a round that failed midway (Redis went away again) is done again, whole.
            self.run_id = run_id
        log.warning("Redis restarted (run_id %s): set up the Redis users of %d jobs again", run_id, count)
        self.restored += count
        return count

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="redis users", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check()
            except redis.RedisError as exc:  # Redis is down or starting: the next round sees its new run_id
                log.info("Redis users: Redis not reachable: %s", exc)


def delete_user(cfg: config.OperatorConfig, namespace: str, name: str, uid: str) -> None:
    with _admin(cfg) as admin:
        admin.execute_command("ACL", "DELUSER", render_common.job_prefix(namespace, name, uid))


def delete_keys(cfg: config.OperatorConfig, namespace: str, name: str, uid: str) -> int:
    """Delete every key of the deleted job (its trajectories, feeder positions, scheduler journal, DARTS
    statistics, API quotas); returns how many. Only that job's: one re-created under the name has
    another uid, so keys of its own (possibly written before this runs) are not touched."""
    deleted = 0
    with _admin(cfg) as admin:
        for pattern in auth.redis_key_patterns(render_common.job_prefix(namespace, name, uid)):
            batch: list[bytes] = []
            for key in admin.scan_iter(match=pattern, count=1000):
                batch.append(key)
                if len(batch) == 1000:
                    deleted += int(admin.unlink(*batch))
                    batch.clear()
            if batch:
                deleted += int(admin.unlink(*batch))
    return deleted
