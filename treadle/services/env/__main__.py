"""``python -m treadle.services.env --host 127.0.0.1 --port N``: run the environment service."""

from __future__ import annotations

import argparse

from treadle.services.env import http_app
from treadle.services.httputil import serve


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m treadle.services.env", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8101)
    p.add_argument("--max-sessions", type=int, default=10_000)
    p.add_argument("--step-timeout-s", type=float, default=30.0)
    p.add_argument("--idle-ttl-s", type=float, default=900.0)
    p.add_argument("--sandbox-concurrency", type=int, default=4)
    a = p.parse_args()
    app = http_app.build_app(
        max_sessions=a.max_sessions, step_timeout_s=a.step_timeout_s, idle_ttl_s=a.idle_ttl_s,
        sandbox_concurrency=a.sandbox_concurrency,
    )  # fmt: skip
    serve.run(app, host=a.host, port=a.port)


if __name__ == "__main__":
    main()
