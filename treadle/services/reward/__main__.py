"""``python -m treadle.services.reward --host 127.0.0.1 --port N``: run the reward gateway.

Flags override; a pod started by the operator takes the judge endpoint and model of an
``llm-judge`` job from ``TREADLE_REWARD_EXTERNAL_URL`` / ``TREADLE_REWARD_JUDGE_MODEL``, and the
scoring endpoint of an ``external`` job (every request forwarded) from ``TREADLE_REWARD_EXTERNAL_URL``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from treadle.api import env_vars
from treadle.services.httputil import serve
from treadle.services.reward import http_app


def endpoints(
    judge_url: str | None, external_url: str | None, environ: Mapping[str, str]
) -> tuple[str | None, str | None]:
    """(judge url, external url): the flags, else the job's ``spec.reward.url`` for the type that uses it."""
    reward_type, job_url = environ.get(env_vars.REWARD_TYPE), environ.get(env_vars.REWARD_EXTERNAL_URL)
    return (
        judge_url or (job_url if reward_type == "llm-judge" else None),
        external_url or (job_url if reward_type == "external" else None),
    )


def main(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> None:
    p = argparse.ArgumentParser(prog="python -m treadle.services.reward", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8300)
    p.add_argument(
        "--judge-url",
        help=f"OpenAI-compatible base URL (without /v1) for llm-judge (${env_vars.REWARD_EXTERNAL_URL})",
    )
    p.add_argument(
        "--external-url",
        help=f"forward every score request here (${env_vars.REWARD_EXTERNAL_URL} when type external)",
    )
    p.add_argument("--judge-model", help=f"model name to send to the judge (${env_vars.REWARD_JUDGE_MODEL})")
    p.add_argument("--allow-user-module", action="append", default=[], help="module prefix for py: functions")
    p.add_argument("--max-concurrency", type=int, default=64)
    p.add_argument("--timeout-s", type=float, default=30.0)
    p.add_argument("--sandbox-concurrency", type=int, default=4)
    a = p.parse_args(argv)
    judge_url, external_url = endpoints(a.judge_url, a.external_url, environ)
    judge_model = a.judge_model or environ.get(env_vars.REWARD_JUDGE_MODEL)
    app = http_app.build_app(
        judge_url=judge_url, judge_model=judge_model, external_url=external_url,
        user_prefixes=tuple(a.allow_user_module), max_concurrency=a.max_concurrency,
        timeout_s=a.timeout_s, sandbox_concurrency=a.sandbox_concurrency,
    )  # fmt: skip
    serve.run(app, host=a.host, port=a.port)


if __name__ == "__main__":
    main()
