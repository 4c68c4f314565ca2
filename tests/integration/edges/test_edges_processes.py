"""Each edge service started as its own process (``python -m treadle.services.<name>``), as the operator
and ``treadle run`` start them; and an env server killed mid-episode surfaces as retryable errors."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from treadle import errors
from treadle.services.agent import client as agent_client
from treadle.services.agent import protocol as agent_protocol
from treadle.services.env import client as env_client
from treadle.testing import procs


def healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def engine_healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def start(name: str, *args: str) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    port = procs.free_port()
    argv = [
        sys.executable,
        "-m",
        f"treadle.services.{name}",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *args,
    ]
    check = engine_healthy if name == "fakevllm" else healthy
    with procs.running(name, argv, lambda: check(port), timeout=60) as proc:
        yield port, proc


@pytest.fixture
def fake_engine_port() -> Iterator[int]:
    with start("fakevllm", "--step-ms", "1") as (port, _):
        yield port


async def test_agent_and_engine_processes(fake_engine_port: int) -> None:
    engine_url = f"http://127.0.0.1:{fake_engine_port}"
    with start("agent", "--engine-url", engine_url, "--worker-id", "w7") as (port, _):
        c = agent_client.AgentClient(f"http://127.0.0.1:{port}")
        req = agent_protocol.GenerateRequest(
            trajectory_id="p",
            turn=0,
            messages=[agent_protocol.ChatMessage(role="user", content="x")],
            max_tokens=4,
        )
        result = await c.generate(req)
        assert result.output_token_ids and len(result.output_versions) == len(result.output_token_ids)
        assert (await c.load()).worker_id == "w7"
        async with httpx.AsyncClient() as h:
            text = (await h.get(f"http://127.0.0.1:{port}/metrics")).text
        assert "treadle_agent_generated_tokens_total" in text
        await c.aclose()


async def test_reward_process_scores() -> None:
    with start("reward") as (port, _):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as h:
            body = {
                "trajectory_id": "t",
                "reward_fn": "math",
                "response": "<answer>3</answer>",
                "reference": "3",
            }
            assert (await h.post("/v1/score", json=body)).json()["reward"] == 1.0


async def test_killing_the_env_server_mid_episode_is_retryable_then_not_found() -> None:
    with start("env") as (port, proc):
        c = env_client.EnvClient(f"http://127.0.0.1:{port}", timeout_s=5)
        await c.open(env="math-tool", session_id="traj", seed=3)
        await c.step("traj", "<calculator>1+1</calculator>")
        proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(proc.wait)
        with pytest.raises(errors.Unavailable):
            await c.step("traj", "<answer>2</answer>")  # the scheduler retries these with backoff
        await c.aclose()
    # a replacement server does not know the session: the retry gets NotFound, and the
    # trajectory is marked failed with that reason (or re-opened from its seed)
    with start("env") as (port, _):
        c = env_client.EnvClient(f"http://127.0.0.1:{port}")
        with pytest.raises(errors.NotFound, match="traj"):
            await c.step("traj", "<answer>2</answer>")
        await c.aclose()
