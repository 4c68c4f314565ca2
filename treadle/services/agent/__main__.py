"""``python -m treadle.services.agent --engine-url URL --port N``: the inference agent beside vLLM."""

from __future__ import annotations

import argparse
import socket

from treadle.services.agent import http_app
from treadle.services.httputil import serve


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m treadle.services.agent", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8200)
    p.add_argument("--engine-url", default="http://127.0.0.1:8000", help="the vLLM server beside this agent")
    p.add_argument("--worker-id", default=socket.gethostname())
    p.add_argument("--poll-interval-s", type=float, default=0.5)
    a = p.parse_args()
    app = http_app.build_app(
        engine_url=a.engine_url, worker_id=a.worker_id, poll_interval_s=a.poll_interval_s
    )
    serve.run(app, host=a.host, port=a.port)


if __name__ == "__main__":
    main()
