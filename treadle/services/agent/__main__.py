"""``python -m treadle.services.agent --engine-url URL --port N``: the inference agent beside vLLM.

Flags override; in a pod the operator renders the engine (``TREADLE_ENGINE_URL``), placement's
address (``TREADLE_PLACEMENT_ADDR``) and the pool (``TREADLE_POOL``). Given placement, the agent
registers itself there and reports its load; without it (local mode) the caller does.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
from collections.abc import Mapping
from pathlib import Path

from treadle import errors
from treadle.api import env_vars
from treadle.services import podenv
from treadle.services.agent import http_app, service
from treadle.services.httputil import serve

PROG = "python -m treadle.services.agent"
log = logging.getLogger(__name__)


def main(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> None:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8200)
    p.add_argument(
        "--engine-url", default=environ.get(env_vars.ENGINE_URL) or "http://127.0.0.1:8000",
        help=f"the vLLM server beside this agent (${env_vars.ENGINE_URL})",
    )  # fmt: skip
    p.add_argument("--worker-id", default=socket.gethostname(), help="default: the pod's name")
    p.add_argument("--poll-interval-s", type=float, default=0.5, help="engine poll and load report period")
    p.add_argument(
        "--placement", default=environ.get(env_vars.PLACEMENT_ADDR),
        help=f"placement to register with and report to (${env_vars.PLACEMENT_ADDR})",
    )  # fmt: skip
    p.add_argument(
        "--pool", default=environ.get(env_vars.POOL), help=f"this worker's pool (${env_vars.POOL})"
    )
    p.add_argument(
        "--agent", default=environ.get(env_vars.AGENT, ""),
        help=f"the agent whose weights the engine starts with (${env_vars.AGENT})",
    )  # fmt: skip
    p.add_argument(
        "--swap-lease-s", type=float, default=service.DEFAULT_SWAP_LEASE_S,
        help="a weight swap's pause not resumed by its caller within this is resumed by the agent",
    )  # fmt: skip
    p.add_argument(
        "--state-file", type=Path, default=environ.get(env_vars.AGENT_STATE) or None,
        help=f"keeps what a move made this worker serve across restarts (${env_vars.AGENT_STATE})",
    )  # fmt: skip
    p.add_argument("--advertise-url", help="URL the scheduler dials; default http://<pod IP>:<port>")
    a = p.parse_args(argv)

    def address() -> str:
        if a.placement and not a.pool:
            raise errors.SpecError(f"not set: pass --pool or set {env_vars.POOL}", field=env_vars.POOL)
        return a.advertise_url or f"http://{podenv.advertised_host(a.host)}:{a.port}"

    url = podenv.or_exit(address, prog=PROG)
    token = podenv.or_exit(lambda: podenv.token(environ), prog=PROG)
    if a.placement:
        log.info("worker %s (pool %s) at %s", a.worker_id, a.pool, url)
    app = http_app.build_app(
        engine_url=a.engine_url, worker_id=a.worker_id, poll_interval_s=a.poll_interval_s,
        placement=a.placement, pool=a.pool or "", address=url, agent=a.agent, swap_lease_s=a.swap_lease_s,
        state_file=a.state_file, token=token,
    )  # fmt: skip
    podenv.serve_metrics(
        app.state.registry, a.host, podenv.or_exit(lambda: podenv.metrics_port(environ), prog=PROG)
    )
    serve.run(app, host=a.host, port=a.port)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    main()
