"""``python -m treadle.services.reward --host 127.0.0.1 --port N``: run the reward gateway.

A pod started by the operator (and local mode, the same way) takes the judge endpoint and model of
an ``llm-judge`` job, and the scoring endpoint of an ``external`` job (every request forwarded), from
the job file's ``spec.reward`` (``treadle.api.jobconfig.RewardConfig``). User functions
(``py:<module>:<function>``) are imported from the modules the job's tasks name and from the
``--allow-user-module`` prefixes; a gateway without a job file serves the built-in functions and
those under ``--allow-user-module`` only. Sandboxed ``code-tests`` runs get their cores from the
pod's action manager, at most ``spec.externalResources.cpuCoresPerAction`` each (unpinned without
a job file).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path

from treadle.api import jobconfig
from treadle.sandbox import cores
from treadle.services import podenv
from treadle.services.httputil import serve
from treadle.services.reward import engines, http_app

PROG = "python -m treadle.services.reward"


def endpoints(job: jobconfig.RewardConfig | None) -> tuple[str | None, str | None]:
    """(judge url, external url): the job's (none without a job)."""
    return (job.judge_url, job.external_url) if job else (None, None)


def main(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> None:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8300)
    p.add_argument(
        "--allow-user-module", action="append", default=[],
        help="module prefix for py: functions (besides the job's own)",
    )  # fmt: skip
    p.add_argument("--max-concurrency", type=int, default=64)
    p.add_argument("--timeout-s", type=float, default=30.0)
    p.add_argument("--sandbox-concurrency", type=int, default=4)
    p.add_argument(
        "--backup-dir", type=Path, default=engines.BACKUP_DIR,
        help="vLLM reward models: where their checkpoints are copied (host memory: a tmpfs)",
    )  # fmt: skip
    a = p.parse_args(argv)
    job = podenv.Job(environ)
    reward = podenv.or_exit(lambda: job.config.reward if job.present else None, prog=PROG)
    judge_url, external_url = endpoints(reward)
    judge_model = reward.judge_model if reward else None
    cpus = podenv.or_exit(lambda: cores.cpus_per_action(reward.cpu_per_action) if reward else None, prog=PROG)
    app = http_app.build_app(
        judge_url=judge_url, judge_model=judge_model, external_url=external_url,
        user_prefixes=(*a.allow_user_module, *(reward.user_modules if reward else ())),
        max_concurrency=a.max_concurrency, timeout_s=a.timeout_s, sandbox_concurrency=a.sandbox_concurrency,
        cpus_per_action=cpus, reward_models=reward.models if reward else (),
        reward_model_gpus=reward.gpus if reward else 0,
        gpu_memory_gb=reward.gpu_memory_gb if reward else jobconfig.RewardConfig.gpu_memory_gb,
        backup_dir=a.backup_dir,
        token=podenv.or_exit(lambda: podenv.token(environ), prog=PROG),
    )  # fmt: skip
    podenv.serve_metrics(
        app.state.registry, a.host, podenv.or_exit(lambda: podenv.metrics_port(environ), prog=PROG)
    )
    serve.run(app, host=a.host, port=a.port)


if __name__ == "__main__":
    main()
