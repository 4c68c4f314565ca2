"""``python -m treadle.services.reward --host 127.0.0.1 --port N``: run the reward gateway.

Flags override; a pod started by the operator (and local mode, the same way) takes the judge
endpoint and model of an ``llm-judge`` job, and the scoring endpoint of an ``external`` job (every
request forwarded), from the job file's ``spec.reward`` (``treadle.api.jobconfig.RewardConfig``).
User functions (``py:<module>:<function>``) are imported from the modules the job's tasks name and
from the ``--allow-user-module`` prefixes.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from treadle.api import jobconfig
from treadle.services import podenv
from treadle.services.httputil import serve
from treadle.services.reward import http_app

PROG = "python -m treadle.services.reward"


def endpoints(
    judge_url: str | None, external_url: str | None, job: jobconfig.RewardConfig | None
) -> tuple[str | None, str | None]:
    """(judge url, external url): the flags, else the job's (none without a job)."""
    return (
        judge_url or (job.judge_url if job else None),
        external_url or (job.external_url if job else None),
    )


def main(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> None:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8300)
    p.add_argument("--judge-url", help="OpenAI-compatible base URL (without /v1) for llm-judge (the job's)")
    p.add_argument("--external-url", help="forward every score request here (the job's, when type external)")
    p.add_argument("--judge-model", help="model name to send to the judge (the job's)")
    p.add_argument(
        "--allow-user-module",
        action="append",
        default=[],
        help="module prefix for py: functions (besides the job's own)",
    )
    p.add_argument("--max-concurrency", type=int, default=64)
    p.add_argument("--timeout-s", type=float, default=30.0)
    p.add_argument("--sandbox-concurrency", type=int, default=4)
    a = p.parse_args(argv)
    job = podenv.Job(environ)
    reward = podenv.or_exit(lambda: job.config.reward if job.present else None, prog=PROG)
    judge_url, external_url = endpoints(a.judge_url, a.external_url, reward)
    judge_model = a.judge_model or (reward.judge_model if reward else None)
    app = http_app.build_app(
        judge_url=judge_url, judge_model=judge_model, external_url=external_url,
        user_prefixes=(*a.allow_user_module, *(reward.user_modules if reward else ())),
        max_concurrency=a.max_concurrency, timeout_s=a.timeout_s, sandbox_concurrency=a.sandbox_concurrency,
    )  # fmt: skip
    serve.run(app, host=a.host, port=a.port)


if __name__ == "__main__":
    main()
