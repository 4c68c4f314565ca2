"""A feeder whose dataset lacks a column, started as in a pod: it stays up, says why on its job, and
feeds once the dataset is fixed.

``python -m treadle.services.feeder`` runs as a process with a pod's variables (``TREADLE_CONFIG``,
``TREADLE_JOB``, ``TREADLE_NAMESPACE``, Redis, scheduler) and API credentials. The API server is a
STAND-IN served on 127.0.0.1 that records each merge patch on the job (the real API server, the
feeder's Role and the operator's Degraded status are the e2e tier's); Redis is real, the scheduler
address answers nothing (the feeder becomes ready once its position is restored from Redis, before
it submits). The operator side (annotation -> Degraded) is in tests/unit/operator/test_render_feeder.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import fastapi
import httpx

from treadle.api import env_vars, v1alpha1
from treadle.services.httputil import serve
from treadle.testing import procs
from treadle.testing import redis_server as redis_server_mod

ROOT = Path(__file__).resolve().parents[3]
NAMESPACE, JOB = "team-a", "fed"


def _api(patches: list[dict[str, Any]]) -> fastapi.FastAPI:
    app = fastapi.FastAPI()

    @app.patch(f"/apis/{v1alpha1.GROUP}/{v1alpha1.VERSION}/namespaces/{NAMESPACE}/{v1alpha1.PLURAL}/{JOB}")
    async def patch(request: fastapi.Request) -> dict[str, Any]:
        assert request.headers["content-type"] == "application/merge-patch+json"
        patches.append(await request.json())
        return {}

    return app


def _said(patches: list[dict[str, Any]]) -> list[str | None]:
    return [p["metadata"]["annotations"][v1alpha1.FEEDER_PROBLEM_ANNOTATION] for p in patches]


async def test_a_feeder_with_an_unusable_dataset_stays_up_says_why_and_recovers(
    tmp_path: Path, redis_server: redis_server_mod.RedisServer
) -> None:
    rows = tmp_path / "math.jsonl"
    rows.write_text("".join(json.dumps({"id": f"r{i}", "question": f"{i}+1?"}) + "\n" for i in range(8)))
    dataset = {"source": {"path": str(rows)}, "promptColumn": "question", "answerColumn": "answer"}
    spec = {
        "agents": [{"name": "a", "model": "m"}],
        "pools": [{"name": "p", "agent": "a", "accelerator": "H20"}],
        "tasks": [{"name": "seeds", "agents": ["a"], "environment": "math-tool", "reward": "math"},
                  {"name": "rows", "agents": ["a"], "environment": "math-tool", "reward": "math",
                   "dataset": dataset}],
        "feeder": {"volumes": [{"name": "d", "mountPath": str(tmp_path),
                                "hostPath": {"path": str(tmp_path)}}]},
    }  # fmt: skip
    (tmp_path / "job.json").write_text(json.dumps(spec))
    patches: list[dict[str, Any]] = []
    async with serve.running(_api(patches)) as api:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
            f"clusters: [{{name: k, cluster: {{server: '{api}'}}}}]\n"
            "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
        )
        env = {
            env_vars.CONFIG: str(tmp_path / "job.json"), env_vars.JOB: JOB, env_vars.NAMESPACE: NAMESPACE,
            env_vars.REDIS_URL: redis_server.url, env_vars.SCHEDULER_ADDR: f"127.0.0.1:{procs.free_port()}",
            env_vars.KEY_PREFIX: f"{NAMESPACE}/{JOB}-{procs.free_port()}", "KUBECONFIG": str(kubeconfig),
        }  # fmt: skip
        port = procs.free_port()
        argv = [sys.executable, "-m", "treadle.services.feeder", "--port", str(port), "--retry-s", "0.5"]
        url = f"http://127.0.0.1:{port}"
        log = (tmp_path / "feeder.log").open("wb")
        proc = await asyncio.create_subprocess_exec(
            *argv, env={**os.environ, **env}, stdout=log, stderr=asyncio.subprocess.STDOUT
        )
        try:
            async with httpx.AsyncClient(timeout=2.0) as http:

                async def until(
                    what: str, check: Callable[[], Awaitable[bool]], timeout_s: float = 30
                ) -> None:
                    deadline = time.monotonic() + timeout_s
                    while not await check():
                        tail = (tmp_path / "feeder.log").read_text()[-3000:]
                        assert proc.returncode is None, f"the feeder exited {proc.returncode}:\n{tail}"
                        assert time.monotonic() < deadline, f"{what} not within {timeout_s}s:\n{tail}"
                        await asyncio.sleep(0.1)

                async def healthz(code: int) -> bool:
                    try:
                        return (await http.get(f"{url}/healthz")).status_code == code
                    except httpx.TransportError:
                        return False

                async def said_twice() -> bool:
                    return len(patches) >= 2

                # Alive (it answers) but not ready, and saying why on its job, round after round.
                await until("a 503 from /healthz", lambda: healthz(503))
                await until("the problem said again after a retry", said_twice)
                assert proc.returncode is None and await healthz(
                    503
                )  # the same process: no crash, no restart
                said = _said(patches)
                assert said[0] is not None and all(s == said[0] for s in said), said
                assert said[0].startswith("spec.tasks[1].dataset.answerColumn: no column 'answer'"), said[0]

                # The dataset is fixed: the feeder reads it, takes its word back and becomes ready.
                rows.write_text(
                    "".join(json.dumps({"id": f"r{i}", "question": f"{i}+1?", "answer": str(i + 1)}) + "\n"
                            for i in range(8))
                )  # fmt: skip
                await until("/healthz 200 after the fix", lambda: healthz(200))
                assert _said(patches)[-1] is None
                feeds = (await http.get(f"{url}/v1/feeds")).json()
                assert [(f["task"], f["rows"]) for f in feeds] == [("seeds", 0), ("rows", 8)]
        finally:
            if proc.returncode is None:
                proc.terminate()
            await asyncio.wait_for(proc.wait(), timeout=10)
            log.close()
