"""Env step retries over real HTTP: a timed-out step and a lost reply are not applied twice.

The python-code environment counts its turns in ``info["turns"]``, so a double application shows.
"""

from __future__ import annotations

import httpx
import pytest

from treadle import errors
from treadle.services.env import client as env_client

SLOW_WRONG = "```python\nimport time\ntime.sleep(1.5)\ndef add(a, b):\n    return a - b\n```"
RIGHT = "```python\ndef add(a, b):\n    return a + b\n```"


async def test_a_step_retried_after_a_client_timeout_is_applied_once(env_server: str) -> None:
    impatient = env_client.EnvClient(env_server, timeout_s=0.3)
    patient = env_client.EnvClient(env_server, timeout_s=10.0)
    await impatient.open(env="python-code", session_id="slow", seed=0, options={"max_turns": 4})
    with pytest.raises(errors.Unavailable, match="timed out"):
        await impatient.step("slow", SLOW_WRONG)
    # A retry while the step still runs joins it rather than running the code again.
    joined = await patient.step("slow", SLOW_WRONG, index=0)
    assert joined.info["turns"] == 1 and not joined.done
    # The timed-out client's own retry (the scheduler's) reuses its unanswered index: the cached result.
    assert await impatient.step("slow", SLOW_WRONG) == joined
    # The next step is judged by two sandbox processes (code and harness): more than the impatient
    # client's 0.3 s on a loaded machine, so the patient one takes it.
    final = await patient.step("slow", RIGHT)
    assert final.info["turns"] == 2 and final.done
    await impatient.aclose()
    await patient.aclose()


async def test_lost_reply_and_out_of_order_over_http(env_server: str) -> None:
    async with httpx.AsyncClient(base_url=env_server, timeout=10) as h:
        r = await h.post("/v1/sessions", json={"env": "python-code", "session_id": "raw", "seed": 0})
        assert r.status_code == 200
        step0 = {"action": "```python\ndef add(a, b):\n    return 0\n```", "step": 0}
        first = await h.post("/v1/sessions/raw/step", json=step0)
        replay = await h.post("/v1/sessions/raw/step", json=step0)  # the first reply was "lost"
        assert first.status_code == replay.status_code == 200 and first.json() == replay.json()
        assert first.json()["info"]["turns"] == 1
        ahead = await h.post("/v1/sessions/raw/step", json={"action": RIGHT, "step": 3})
        assert ahead.status_code == 409
        assert (
            ahead.json()["error"]["message"]
            == "step 3 of session 'raw' is out of order: 1 applied, the next is 1"
        )
        missing = await h.post("/v1/sessions/raw/step", json={"action": RIGHT})
        assert missing.status_code == 400 and missing.json()["error"]["param"] == "step"
        ok = await h.post("/v1/sessions/raw/step", json={"action": RIGHT, "step": 1})
        assert ok.status_code == 200 and ok.json()["info"]["turns"] == 2
