"""``python -m treadle.services.reward --host 127.0.0.1 --port N``: run the reward gateway."""

from __future__ import annotations

import argparse

from treadle.services.httputil import serve
from treadle.services.reward import http_app


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m treadle.services.reward", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8300)
    p.add_argument("--judge-url", help="OpenAI-compatible base URL (without /v1) for llm-judge")
    p.add_argument("--judge-model", help="model name to send to the judge")
    p.add_argument("--allow-user-module", action="append", default=[], help="module prefix for py: functions")
    p.add_argument("--max-concurrency", type=int, default=64)
    p.add_argument("--timeout-s", type=float, default=30.0)
    p.add_argument("--sandbox-concurrency", type=int, default=4)
    a = p.parse_args()
    app = http_app.build_app(
        judge_url=a.judge_url, judge_model=a.judge_model, user_prefixes=tuple(a.allow_user_module),
        max_concurrency=a.max_concurrency, timeout_s=a.timeout_s, sandbox_concurrency=a.sandbox_concurrency,
    )  # fmt: skip
    serve.run(app, host=a.host, port=a.port)


if __name__ == "__main__":
    main()
