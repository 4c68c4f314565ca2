"""``treadle.auth`` and the pod side of it: which headers pass, where a pod finds its token and its
Redis login, and that each job's Redis key patterns cover every key its stores write and no other job's."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest

from treadle import auth, errors
from treadle.api import env_vars
from treadle.services import podenv
from treadle.services.feeder import store as feeder_store

TOKEN = "s3cret"


@pytest.mark.parametrize(
    ("presented", "refused"),
    [
        (f"Bearer {TOKEN}", None),
        (f"bearer {TOKEN}", None),  # the scheme is case-insensitive (RFC 9110)
        (None, "missing authorization header"),
        ("", "missing authorization header"),
        (TOKEN, "must be 'Bearer <token>'"),  # no scheme
        ("Basic czNjcmV0", "must be 'Bearer <token>'"),
        ("Bearer ", "must be 'Bearer <token>'"),
        ("Bearer s3cre", "is not this job's"),
        (f"Bearer {TOKEN}x", "is not this job's"),
    ],
)
def test_only_the_jobs_token_passes(presented: str | None, refused: str | None) -> None:
    reason = auth.refusal(presented, TOKEN)
    assert (reason is None) if refused is None else (reason is not None and refused in reason)


def test_a_pod_reads_its_token_from_the_mounted_file_and_a_trainer_outside_from_the_variable(
    tmp_path: Path,
) -> None:
    path = auth.write_token(tmp_path / "auth", TOKEN)
    assert path.stat().st_mode & 0o077 == 0  # the owner's only
    assert podenv.token({env_vars.TOKEN_FILE: str(path)}) == TOKEN
    assert auth.token_from({env_vars.TOKEN: "outside"}) == "outside"
    assert podenv.token({}) is None  # a server outside any job: accepts every caller (and says so)
    with pytest.raises(errors.SpecError, match=env_vars.TOKEN_FILE):
        podenv.token({env_vars.TOKEN_FILE: str(tmp_path / "missing")})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(errors.SpecError, match="empty"):
        podenv.token({env_vars.TOKEN_FILE: str(tmp_path / "empty")})


def test_a_pod_logs_in_to_redis_as_its_job_when_it_has_the_jobs_password(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("p@ss/word:1\n")
    environ = {
        env_vars.REDIS_URL: "redis://redis.treadle-system.svc:6379/0",
        env_vars.KEY_PREFIX: "team-a/math",
        env_vars.REDIS_PASSWORD_FILE: str(tmp_path / "pw"),
    }
    assert (
        podenv.redis_url(environ) == "redis://team-a%2Fmath:p%40ss%2Fword%3A1@redis.treadle-system.svc:6379/0"
    )
    assert podenv.redis_url(environ, "") == ""  # no Redis at all
    assert podenv.redis_url(environ, "redis://u:p@h:1/0") == "redis://u:p@h:1/0"  # given with its own login
    without = {k: v for k, v in environ.items() if k != env_vars.REDIS_PASSWORD_FILE}
    assert podenv.redis_url(without) == environ[env_vars.REDIS_URL]  # a Redis without per-job users


def test_a_jobs_redis_patterns_cover_its_keys_and_no_other_jobs() -> None:
    mine, theirs = "team-a/math", "team-a/math-2"
    keys = {
        "buffer": f"treadle:buf:{{{mine}}}:t:abc",
        "feeder": feeder_store.key(mine, "task", "digest"),
        "darts": f"treadle:darts:{{{mine}}}:task",
        "quotas": f"{mine}:tangram:quota:{{search}}:q",
    }
    patterns = auth.redis_key_patterns(mine)
    for store, key in keys.items():
        assert any(fnmatch.fnmatchcase(key, p) for p in patterns), (store, key)
        other = key.replace(mine, theirs)
        assert not any(fnmatch.fnmatchcase(other, p) for p in patterns), (store, other)
