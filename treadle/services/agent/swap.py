"""Change the weights an inference pod's engine serves, through its agent: the one swap sequence.

Called by the trainer's ``treadle.trainer.engines.EngineSwapper`` (a new version of the same
agent's weights) and by placement's rebalancer (``placement.rebalance.HttpSwapper``: a worker moving
to another agent, which loads the receiver's version from the receiver's weight prefix). Either
way: pause through the agent with ``mode="wait"`` (running requests finish on the weights that
started them), with real vLLM apply the version through the weights extension
(``treadle.weights.vllm_extension``) and drop the prefix cache computed with the old weights, set
the engine's weight-version label, and resume through the agent, which re-reads the label so every
later token is tagged with it. The agent resumes even when a step fails; a move's resume names the
receiver's pool, which the agent registers with from then on (``agent.reporter``).
"""

from __future__ import annotations

from typing import Any

import httpx

from treadle import errors
from treadle.services.agent import client as agent_client


class SwapRefused(errors.Unavailable):
    """An engine refused a version; it keeps serving the previous one (the message says why)."""


async def swap(
    agent_url: str,
    engine_url: str,
    *,
    label: str,
    apply_version: int | None,
    timeout_s: float,
    apply_agent: str = "",
    pool: str = "",
) -> None:
    """Swap the engine behind ``agent_url`` to ``label``, first loading ``apply_version`` if given
    (of ``apply_agent``'s versions when named: ``treadle.weights.layout.agent_prefix``); a move names
    the receiver's ``pool``, which the agent is told only once the swap succeeded."""
    agent = agent_client.AgentClient(agent_url, timeout_s=timeout_s)
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as http:
            await agent.pause("wait")
            try:
                if apply_version is not None:
                    args = (str(apply_version), apply_agent) if apply_agent else (str(apply_version),)
                    await collective_rpc(http, engine_url, "treadle_weights_apply", *args)
                    await _post(http, f"{engine_url}/reset_prefix_cache", None)
                await _post(http, f"{engine_url}/update_weight_version", {"new_version": label})
            except BaseException:
                await agent.resume()
                raise
            await agent.resume(pool)
    finally:
        await agent.aclose()


async def collective_rpc(http: httpx.AsyncClient, engine_url: str, method: str, *args: str) -> None:
    """Call a method of the weights extension on every vLLM worker; ``SwapRefused`` unless it answers 200."""
    await _post(http, f"{engine_url}/collective_rpc", {"method": method, "args": list(args)})


async def _post(http: httpx.AsyncClient, url: str, body: dict[str, Any] | None) -> None:
    try:
        response = await http.post(url, json=body)
    except httpx.HTTPError as exc:
        raise errors.Unavailable(f"POST {url}: {type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        raise SwapRefused(f"POST {url} answered HTTP {response.status_code}: {response.text[:300]}")
