"""The one kubelet API route the agent serves: container logs, so ``kubectl logs`` works.

The API server proxies ``kubectl logs [-f] [--previous] [--tail N]`` to
``https://<node InternalIP>:<kubeletEndpoint port>/containerLogs/<ns>/<pod>/<container>``; the agent
answers from the container's log files (one per run: ``<restart>.log``). TLS uses the dev cluster's
own certificate (the API server does not verify kubelets here: no ``--kubelet-certificate-authority``);
the listener is on the bridge gateway, reachable from this machine only.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from treadle.devcluster.nodeagent import pod

PORT = 10250
FOLLOW_POLL_S = 0.2

Finder = Callable[[str, str], "pod.PodRunner | None"]


def tail_lines(data: bytes, lines: int | None) -> bytes:
    if lines is None:
        return data
    if lines <= 0:
        return b""
    kept = data.splitlines(keepends=True)[-lines:]
    return b"".join(kept)


def build_app(find: Finder) -> web.Application:
    async def container_logs(request: web.Request) -> web.StreamResponse:
        ns, name, container = (request.match_info[k] for k in ("ns", "pod", "container"))
        runner = find(ns, name)
        c = next((c for c in (*runner.init, *runner.main) if c.name == container), None) if runner else None
        if runner is None or c is None:
            raise web.HTTPNotFound(text=f"container {container!r} of pod {ns}/{name} is not on this node")
        previous = request.query.get("previous") == "true"
        run = c.restart_count - 1 if previous else c.restart_count
        path = runner.dir / c.name / f"{run}.log"
        if run < 0 or not path.is_file():
            what = "previous terminated container" if previous else "container log"
            raise web.HTTPBadRequest(text=f"{what} {container!r} in pod {name!r} not found")
        tail = int(request.query["tailLines"]) if "tailLines" in request.query else None
        limit = int(request.query["limitBytes"]) if "limitBytes" in request.query else None
        data = tail_lines(path.read_bytes(), tail)[:limit]
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        await response.write(data)
        if request.query.get("follow") == "true" and not previous:
            await _follow(response, path, path.stat().st_size, lambda: c.restart_count != run or c.done)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/containerLogs/{ns}/{pod}/{container}", container_logs)
    return app


async def _follow(response: web.StreamResponse, path: Path, offset: int, ended: Callable[[], bool]) -> None:
    """Stream what is appended to ``path`` until ``ended()`` and nothing more is left to send."""
    while True:
        over = ended()
        with path.open("rb") as f:
            f.seek(offset)
            chunk = f.read()
        if chunk:
            offset += len(chunk)
            await response.write(chunk)
        elif over:
            return
        await asyncio.sleep(FOLLOW_POLL_S)


async def serve(host: str, cert: Path, key: Path, find: Finder) -> web.AppRunner:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    runner = web.AppRunner(build_app(find), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, PORT, ssl_context=context).start()
    return runner
