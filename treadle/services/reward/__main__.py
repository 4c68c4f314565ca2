"""``python -m treadle.services.reward --host 127.0.0.1 --port N``: run the reward gateway.

Flags override; a pod started by the operator takes the judge endpoint and model of an
``llm-judge`` job from ``TREADLE_REWARD_EXTERNAL_URL`` / ``TREADLE_REWARD_JUDGE_MODEL``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from treadle.services import podenv
from treadle.services.httputil import serve
from treadle.services.reward import http_app


def main(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> None:
    p = argparse.ArgumentParser(prog="python -m treadle.services.reward", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8300)
    p.add_argument(
        "--judge-url",
        help=f"OpenAI-compatible base URL (without /v1) for llm-judge (${podenv.REWARD_EXTERNAL_URL})",
    )
    p.add_argument("--judge-model", help=f"model name to send to the judge (${podenv.REWARD_JUDGE_MODEL})")
    p.add_argument("--allow-user-module", action="append", default=[], help="module prefix for py: functions")
    p.add_argument("--max-concurrency", type=int, default=64)
    p.add_argument("--timeout-s", type=float, default=30.0)
    p.add_argument("--sandbox-concurrency", type=int, default=4)
    a = p.parse_args(argv)
    judge = environ.get(podenv.REWARD_TYPE) == "llm-judge"
    judge_url = a.judge_url or (environ.get(podenv.REWARD_EXTERNAL_URL) if judge else None)
    judge_model = a.judge_model or environ.get(podenv.REWARD_JUDGE_MODEL)
    app = http_app.build_app(
        judge_url=judge_url, judge_model=judge_model, user_prefixes=tuple(a.allow_user_module),
        max_concurrency=a.max_concurrency, timeout_s=a.timeout_s, sandbox_concurrency=a.sandbox_concurrency,
    )  # fmt: skip
    serve.run(app, host=a.host, port=a.port)


if __name__ == "__main__":
    main()
