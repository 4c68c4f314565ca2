"""``python -m treadle.services.env --host 127.0.0.1 --port N``: run the environment service.

A pod started by the operator lists the environments its job needs in ``TREADLE_ENVIRONMENTS``;
one this image does not serve is a startup error, not a failure on the first trajectory.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from treadle import errors
from treadle.services import podenv
from treadle.services.env import http_app, service
from treadle.services.httputil import serve

PROG = "python -m treadle.services.env"


def check_environments(environ: Mapping[str, str]) -> None:
    """Refuse to start without every environment the job's tasks name."""
    wanted = {name for name in environ.get(podenv.ENVIRONMENTS, "").split(",") if name}
    if missing := sorted(wanted - set(service.BUILTIN)):
        raise errors.SpecError(
            f"this image serves no environment {missing}; it serves {sorted(service.BUILTIN)}",
            field=podenv.ENVIRONMENTS, value=missing,
        )  # fmt: skip


def main(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> None:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8101)
    p.add_argument("--max-sessions", type=int, default=10_000)
    p.add_argument("--step-timeout-s", type=float, default=30.0)
    p.add_argument("--idle-ttl-s", type=float, default=900.0)
    p.add_argument("--sandbox-concurrency", type=int, default=4)
    a = p.parse_args(argv)
    podenv.or_exit(lambda: check_environments(environ), prog=PROG)
    app = http_app.build_app(
        max_sessions=a.max_sessions, step_timeout_s=a.step_timeout_s, idle_ttl_s=a.idle_ttl_s,
        sandbox_concurrency=a.sandbox_concurrency,
    )  # fmt: skip
    serve.run(app, host=a.host, port=a.port)


if __name__ == "__main__":
    main()
