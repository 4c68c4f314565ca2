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

import contextlib
from typing import Any

import httpx

from treadle import errors
from treadle.services.agent import client as agent_client


class SwapRefused(errors.Unavailable):
    """An engine refused a version; it keeps serving the previous one (the message says why)."""


class SwapContended(SwapRefused):
    """The worker's agent refused the swap before anything changed: another swap (the trainer's, or a
    rebalancing move) is under way, or the engine serves another agent than the caller read. The
    caller reads again which agent the worker serves (``AgentClient.load().agent``) and retries."""


async def swap(
    agent_url: str,
    engine_url: str,
    *,
    label: str,
    apply_version: int | None,
    timeout_s: float,
    agent: str = "",
    expect_agent: str = "",
    pool: str = "",
) -> None:
    """Swap the engine behind ``agent_url`` to ``label``, first loading ``apply_version`` if given.

    ``agent``: whose weights it serves afterwards; the version is then that agent's
    (``treadle.weights.layout.agent_prefix``), and the inference agent records it. ``expect_agent``:
    whose weights the caller read it serves now (``SwapContended`` if that changed). A move names
    the receiver's ``pool``. The inference agent is told ``agent`` and ``pool`` only once the swap
    succeeded.
    """
    client = agent_client.AgentClient(agent_url, timeout_s=timeout_s)
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as http:
            try:
                swap_id = await client.pause("wait", expect_agent=expect_agent)
            except errors.Conflict as exc:
                raise SwapContended(f"{agent_url}: {exc}") from exc
            try:
                if apply_version is not None:
                    args = (str(apply_version), agent) if agent else (str(apply_version),)
                    await collective_rpc(http, engine_url, "treadle_weights_apply", *args)
                    await _post(http, f"{engine_url}/reset_prefix_cache", None)
                await _post(http, f"{engine_url}/update_weight_version", {"new_version": label})
            except BaseException:
                with contextlib.suppress(errors.Conflict):  # the lease already resumed it
                    await client.resume(swap_id=swap_id)
                raise
            try:
                await client.resume(pool, agent, swap_id=swap_id)
            except errors.Conflict as exc:
                raise SwapRefused(f"{agent_url}: the swap outlived its lease: {exc}") from exc
    finally:
        await client.aclose()


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
