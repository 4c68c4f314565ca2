"""Run a FastAPI app under uvicorn, in a process (``__main__`` modules) or in a test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import fastapi
import uvicorn

from treadle.services import runtime


def config(app: fastapi.FastAPI, host: str, port: int) -> uvicorn.Config:
    # Access logs cost ~10 % of a small request's time; the metrics middleware counts requests.
    # Idle keep-alive connections live longer than the clients' (httputil.client: 30 s), so a client
    # never sends on a connection the server is closing (uvicorn's default of 5 s raced under load).
    return uvicorn.Config(
        app, host=host, port=port, log_level="warning", access_log=False, lifespan="on", timeout_keep_alive=75
    )


def run(app: fastapi.FastAPI, *, host: str, port: int) -> None:
    """Serve until SIGINT/SIGTERM (uvicorn drains in-flight requests first); the process's own heap
    is settled first (``runtime.settle_heap``): everything is imported and the app built."""
    runtime.settle_heap()
    uvicorn.Server(config(app, host, port)).run()


@contextlib.asynccontextmanager
async def running(app: fastapi.FastAPI, *, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Serve ``app`` in this loop on a free port until the block exits; yields the base URL."""
    server = uvicorn.Server(config(app, host, port))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("uvicorn exited before starting")
            await asyncio.sleep(0.005)
        sock = server.servers[0].sockets[0]
        bound_port = sock.getsockname()[1]
        yield f"http://{host}:{bound_port}"
    finally:
        server.should_exit = True
        await task
