"""``python -m treadle.services.env --host 127.0.0.1 --port N``: run the environment service.

A pod started by the operator (and local mode, the same way) reads its job file
(``treadle.api.jobconfig.EnvConfig``): an environment the job's tasks name that this image does not
serve is a startup error, not a failure on the first trajectory. User environments
(``py:<module>:<Class>``) are imported from the modules the job names and from the
``--allow-user-module`` prefixes, as the reward gateway's user functions;
``spec.environment.warmPool`` and ``spec.externalResources.cpuCoresPerAction`` size the sandbox
(``cpuCoresPerAction``: the most cores the pod's action manager grants one action).
``spec.externalResources.apiQuotas`` are kept in Redis (``TREADLE_REDIS_URL``, keys under
``TREADLE_KEY_PREFIX``) and shared by every env server of the job. An env server without a job file
keeps no warm sandbox, grants an action 1 CPU and limits no tool.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Collection, Mapping

from treadle import errors
from treadle.api import env_vars, jobconfig
from treadle.sandbox import cores
from treadle.services import plugin, podenv
from treadle.services.env import http_app, pythoncode, service
from treadle.services.httputil import serve

PROG = "python -m treadle.services.env"


def check_environments(wanted: Collection[str], user_prefixes: tuple[str, ...] = ()) -> None:
    """Refuse to start without every environment the job's tasks name: a built-in, or user code
    that imports from an allowed module (imported here once, so a missing module fails the pod)."""
    field = f"{env_vars.CONFIG}:spec.tasks.environment"
    user = sorted(n for n in wanted if n.startswith(plugin.PREFIX))
    if missing := sorted(set(wanted) - set(service.BUILTIN) - set(user)):
        raise errors.SpecError(
            f"this image serves no environment {missing}; it serves {sorted(service.BUILTIN)}"
            f" and user environments py:MODULE:CLASS", field=field, value=missing,
        )  # fmt: skip
    for name in user:
        plugin.load(name, user_prefixes, what="user environment", field=field)


def warm_pool(job: jobconfig.EnvConfig | None) -> int:
    """Warm sandbox processes for python-code: 0 without a job or when it runs no python-code task."""
    return job.warm_pool if job is not None and pythoncode.SPEC.name in job.environments else 0


def main(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> None:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8101)
    p.add_argument("--max-sessions", type=int, default=10_000)
    p.add_argument("--step-timeout-s", type=float, default=30.0)
    p.add_argument("--idle-ttl-s", type=float, default=900.0)
    p.add_argument("--sandbox-concurrency", type=int, default=4)
    p.add_argument(
        "--allow-user-module", action="append", default=[],
        help="module prefix for py: environments (besides the job's own)",
    )  # fmt: skip
    a = p.parse_args(argv)
    job = podenv.Job(environ)
    env = podenv.or_exit(lambda: job.config.env if job.present else None, prog=PROG)
    prefixes = (*a.allow_user_module, *(env.user_modules if env else ()))
    if env is not None:
        podenv.or_exit(lambda: check_environments(env.environments, prefixes), prog=PROG)
    cpus = podenv.or_exit(lambda: cores.cpus_per_action(env.cpu_per_action if env else "1"), prog=PROG)
    app = podenv.or_exit(
        lambda: http_app.build_app(
            max_sessions=a.max_sessions, step_timeout_s=a.step_timeout_s, idle_ttl_s=a.idle_ttl_s,
            sandbox_concurrency=a.sandbox_concurrency, warm_pool=warm_pool(env), cpus_per_action=cpus,
            user_prefixes=prefixes, api_quotas=env.api_quotas if env else None,
            redis_url=podenv.redis_url(environ),
            namespace=environ.get(env_vars.KEY_PREFIX) or (job.config.job if env else "default"),
            token=podenv.token(environ),
        ),
        prog=PROG,
    )  # fmt: skip
    podenv.serve_metrics(
        app.state.registry, a.host, podenv.or_exit(lambda: podenv.metrics_port(environ), prog=PROG)
    )
    serve.run(app, host=a.host, port=a.port)


if __name__ == "__main__":
    main()
