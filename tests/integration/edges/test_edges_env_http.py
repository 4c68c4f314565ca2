"""The env service over HTTP: whole episodes of each environment, errors, and many sessions at once."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from treadle import errors
from treadle.services.env import client as env_client
from treadle.services.env import mathtool


async def test_math_tool_episode(env_server: str) -> None:
    c = env_client.EnvClient(env_server)
    first = await c.open(env="math-tool", session_id="traj-1", seed=11)
    assert first.info["reward_fn"] == "math" and not first.done
    expr, ref = mathtool.make_problem(11)
    assert first.info["reference"] == ref
    tool = await c.step("traj-1", f"<calculator>{expr}</calculator>")
    assert tool.observation == f"<result>{ref}</result>"
    final = await c.step("traj-1", f"<answer>{ref}</answer>")
    assert final.done and final.info["answer"] == ref
    await c.close("traj-1")
    with pytest.raises(errors.NotFound):
        await c.step("traj-1", "x")
    await c.aclose()


async def test_python_code_episode_runs_in_the_sandbox(env_server: str) -> None:
    c = env_client.EnvClient(env_server)
    first = await c.open(env="python-code", session_id="code-1", seed=0, options={"max_turns": 2})
    assert first.info["reward_fn"] == "code-tests" and "add(" in first.observation
    wrong = await c.step("code-1", "```python\ndef add(a, b):\n    return a - b\n```")
    assert not wrong.done and "AssertionError" in wrong.observation and wrong.info["status"] == "error"
    right = await c.step("code-1", "```python\ndef add(a, b):\n    return a + b\n```")
    assert right.done and right.info["passed"] is True
    await c.aclose()


async def test_frozenlake_episode_gives_env_reward(env_server: str) -> None:
    c = env_client.EnvClient(env_server)
    first = await c.open(env="frozenlake", session_id="lake-1", seed=5, options={"size": 3, "max_turns": 2})
    assert first.info["reward_fn"] == "env" and "P" in first.observation
    await c.step("lake-1", "up")
    last = await c.step("lake-1", "left")  # walls only: still on S, out of turns
    assert last.done and last.reward == 0.0
    await c.aclose()


async def test_errors_have_the_shape_and_name_the_field(env_server: str) -> None:
    async with httpx.AsyncClient(base_url=env_server) as h:
        r = await h.post("/v1/sessions", json={"env": "math-tool", "session_id": "bad id!", "seed": 1})
        assert r.status_code == 400 and r.json()["error"]["param"] == "session_id"
        r = await h.post("/v1/sessions", json={"env": "math-tool", "session_id": "a", "seed": -1})
        assert r.status_code == 400 and r.json()["error"]["param"] == "seed"
        r = await h.post("/v1/sessions/nope/step", json={"action": "x", "step": 0})
        assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"
        r = await h.post("/v1/sessions", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
        r = await h.post("/v1/sessions/x/step", content=b"x" * (9 * 1024 * 1024))
        assert r.status_code == 413 and r.json()["error"]["param"] == "body"
        r = await h.get("/v1/no-such-route")
        assert r.status_code == 404 and r.json()["error"]["code"] == 404
        assert (await h.get("/v1/stats")).json()["opened"] == 0  # nothing stored by any of these
    c = env_client.EnvClient(env_server)
    with pytest.raises(errors.SpecError) as exc:
        await c.open(env="math-tool", session_id="job/traj/1", seed=1)  # ids are path-safe by contract
    assert exc.value.field == "session_id"
    with pytest.raises(errors.NotFound):
        await c.step("job/traj/1", "x")  # quoted into one path segment, not another route
    await c.aclose()


async def test_hundreds_of_concurrent_sessions(env_server: str) -> None:
    c = env_client.EnvClient(env_server)
    n = 300  # bench/edges_env_sessions.py measures thousands; this checks correctness under concurrency
    opened = await asyncio.gather(*(c.open(env="math-tool", session_id=f"s{i}", seed=i) for i in range(n)))
    stepped = await asyncio.gather(
        *(c.step(f"s{i}", f"<answer>{o.info['reference']}</answer>") for i, o in enumerate(opened))
    )
    assert all(s.done for s in stepped)
    assert (await c.stats()).active == n
    await asyncio.gather(*(c.close(f"s{i}") for i in range(n)))
    assert (await c.stats()).active == 0
    await c.aclose()
