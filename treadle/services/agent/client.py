"""Async client of the inference agent; the scheduler sends each trajectory turn through it (ADD/ABORT).

``generate`` returns ``finish_reason="abort"`` (no tokens) when the turn was aborted, by ``abort`` or
by a ``pause(mode="abort")``; the caller re-issues the turn later.

``swap``: change the weights an inference pod's engine serves, through its agent: the one swap sequence.

Called by the trainer's ``treadle.trainer.engines.EngineSwapper`` (a new version of the same
agent's weights), by placement's ``rebalance.HttpSwapper`` for its rebalancer (a worker moving to
another agent, which loads the receiver's version from the receiver's weight prefix) and for its
weight sync (``placement.weightsync``: a new version on every worker), and, through
``swap_through``, by the agent itself (``agent.reload``: the version placement wants it to serve).
Either way: pause through the agent with ``mode="wait"`` (running requests finish on the weights that
started them), with real vLLM apply the version through vLLM's weight-update routes and Treadle's
weight-transfer engine (``treadle.weights.transfer_engine``) and drop the prefix cache computed with
the old weights, set the engine's weight-version label, and resume through the agent, which re-reads
the label so every later token is tagged with it. The agent resumes even when a step fails; a move's
resume names the receiver's pool, which the agent registers with from then on (``agent.reporter``).
It lives here, the agent's public face, so that placement (a service of its own) can call it
without importing the agent's server side (the ``services-independent`` contract in ``.importlinter``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Literal, Protocol

import httpx

from treadle import errors
from treadle.services.agent import protocol
from treadle.services.httputil import client as http


class AgentClient:
    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 120.0,
        connect_wait_s: float = http.RESTART_WAIT_S,
        token: str | None = None,
    ) -> None:
        """``connect_wait_s``: how long ``generate`` waits for an agent restarting on its port."""
        self._http = http.new_client(base_url, timeout_s=timeout_s, token=token)
        self.connect_wait_s = connect_wait_s

    async def generate(self, req: protocol.GenerateRequest) -> protocol.GenerateResult:
        # pydantic-core encodes and parses in one pass each (~4x cheaper than dicts through the json module).
        body = await http.call_raw(
            self._http, "POST", "/v1/generate", content=req.model_dump_json().encode(),
            connect_wait_s=self.connect_wait_s,
        )  # fmt: skip
        return protocol.GenerateResult.model_validate_json(body)

    async def abort(self, trajectory_id: str) -> bool:
        body = await http.call(self._http, "POST", "/v1/abort", json={"trajectory_id": trajectory_id})
        return bool(protocol.AbortResult.model_validate(body).aborted)

    async def load(self) -> protocol.WorkerLoad:
        return protocol.WorkerLoad.model_validate(await http.call(self._http, "GET", "/v1/load"))

    async def pause(self, mode: Literal["abort", "wait", "keep"] = "keep", *, expect_agent: str = "") -> str:
        """Start a swap and return its id; ``Conflict`` while another is under way, or if the engine
        serves another agent than ``expect_agent``."""
        body = await http.call(
            self._http, "POST", "/v1/pause", json={"mode": mode, "expect_agent": expect_agent}
        )
        return str(body["swap_id"])

    async def resume(self, pool: str = "", agent: str = "", *, swap_id: str = "") -> None:
        """End the swap ``swap_id`` (empty: whichever is under way); ``pool`` and ``agent`` name what a
        rebalancing move just gave this worker."""
        await http.call(
            self._http, "POST", "/v1/resume", json={"pool": pool, "agent": agent, "swap_id": swap_id}
        )

    async def aclose(self) -> None:
        await self._http.aclose()


class SwapRefused(errors.Unavailable):
    """An engine refused a version; it keeps serving the previous one (the message says why)."""


class SwapContended(SwapRefused):
    """The worker's agent refused the swap before anything changed: another swap (the trainer's, or a
    rebalancing move) is under way, or the engine serves another agent than the caller read. The
    caller reads again which agent the worker serves (``AgentClient.load().agent``) and retries."""


def label(agent: str, version: int) -> str:
    """The engine's weight-version label of ``agent``'s weights at ``version`` (the agent parses the int);
    the bare version when no agent is named (a single-agent job)."""
    return f"{agent}-{version}" if agent else str(version)


Pull = Literal["prefetched", "pulled", "held", "label"]


@dataclasses.dataclass(frozen=True)
class Swapped:
    """How a swap went: the exposed part (generation paused) and how the version reached the engine."""

    exposed_s: float
    pull: Pull
    """``prefetched``: pulled while generating (hidden); ``pulled``: during the pause (exposed);
    ``held``: the engine already served it (a swap retried after its agent restarted between the
    load and the resume); ``label``: nothing loaded, only the label moved (the SIMULATED engine)."""


class Gate(Protocol):
    """Where a swap pauses and resumes: the worker's agent over HTTP (``AgentClient``), or the agent's
    own service when it loads its target version by itself (``agent.http_app``)."""

    async def pause(
        self, mode: Literal["abort", "wait", "keep"] = "keep", *, expect_agent: str = ""
    ) -> str: ...

    async def resume(self, pool: str = "", agent: str = "", *, swap_id: str = "") -> None: ...


class SwapLost(errors.Unavailable):
    """The worker's agent no longer holds the caller's swap at its resume (the agent restarted, or the
    swap's lease ended): the engine keeps what was loaded, and the agent resumed it or will. Worth
    trying again: the next swap finds the version held and only relabels and resumes."""


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
    token: str | None = None,
) -> Swapped:
    """Swap the engine behind ``agent_url`` to ``label``, first loading ``apply_version`` if given.

    ``agent``: whose weights it serves afterwards; the version is then that agent's
    (``treadle.weights.layout.agent_prefix``), and the inference agent records it. ``expect_agent``:
    whose weights the caller read it serves now (``SwapContended`` if that changed). A move names
    the receiver's ``pool``. The inference agent is told ``agent`` and ``pool`` only once the swap
    succeeded. ``token``: the job's (``treadle.auth``).
    """
    client = AgentClient(agent_url, timeout_s=timeout_s, token=token)
    try:
        return await swap_through(
            client, engine_url, label=label, apply_version=apply_version, timeout_s=timeout_s,
            agent=agent, expect_agent=expect_agent, pool=pool, where=agent_url,
        )  # fmt: skip
    finally:
        await client.aclose()


async def swap_through(
    gate: Gate,
    engine_url: str,
    *,
    label: str,
    apply_version: int | None,
    timeout_s: float,
    agent: str = "",
    expect_agent: str = "",
    pool: str = "",
    where: str = "",
) -> Swapped:
    """``swap`` with the pause and resume through ``gate``; ``where`` names the worker in errors."""
    async with httpx.AsyncClient(timeout=timeout_s) as http:
        try:
            swap_id = await gate.pause("wait", expect_agent=expect_agent)
        except errors.Conflict as exc:
            raise SwapContended(f"{where}: {exc}") from exc
        paused = time.perf_counter()
        try:
            pull: Pull = "label"
            if apply_version is not None:
                pull = await _apply(http, engine_url, apply_version, agent)
            await _post(http, f"{engine_url}/update_weight_version", {"new_version": label})
        except BaseException:
            with contextlib.suppress(
                errors.Conflict, errors.Unavailable
            ):  # the lease resumed it / agent gone
                await gate.resume(swap_id=swap_id)
            raise
        try:
            await gate.resume(pool, agent, swap_id=swap_id)
        except errors.Conflict as exc:
            raise SwapLost(f"{where}: the swap outlived its lease: {exc}") from exc
        return Swapped(exposed_s=time.perf_counter() - paused, pull=pull)


async def _apply(http: httpx.AsyncClient, engine_url: str, version: int, agent: str) -> Pull:
    """Load ``version`` unless every engine worker holds it already; then drop the old prefix cache.

    Through vLLM's weight-update routes and Treadle's weight-transfer engine
    (``treadle.weights.transfer_engine``): start, ``update_weights`` with the version (and the agent of
    a move), finish. A refused version answers 500 (``SwapRefused``) and the engine keeps the old one.
    """
    before = await _statuses(http, engine_url)
    if before and all(_holds(s, version, agent) for s in before):
        return "held"
    prefetched = bool(before) and all(version in s.get("prefetched", ()) for s in before)
    info: dict[str, Any] = {"version": version, **({"agent": agent} if agent else {})}
    await _start_update(http, engine_url)
    try:
        await _post(http, f"{engine_url}/update_weights", {"update_info": info})
    except errors.TreadleError:
        # vLLM ends the session when the engine raises; an answer lost on the way may leave it open.
        with contextlib.suppress(errors.TreadleError):
            await _post(http, f"{engine_url}/finish_weight_update", {})
        raise
    await _post(http, f"{engine_url}/finish_weight_update", {})
    await _post(http, f"{engine_url}/reset_prefix_cache", None)
    return "prefetched" if prefetched else "pulled"


async def _start_update(http: httpx.AsyncClient, engine_url: str) -> None:
    """``/start_weight_update``; a session left open by a swap whose caller went away between its start
    and its finish is finished first (the engine loads nothing in either step)."""
    try:
        await _post(http, f"{engine_url}/start_weight_update", None)
    except SwapRefused as exc:
        if "already active" not in str(exc):
            raise
        await _post(http, f"{engine_url}/finish_weight_update", {})
        await _post(http, f"{engine_url}/start_weight_update", None)


def _holds(status: dict[str, Any], version: int, agent: str) -> bool:
    """The extension's status says it serves ``agent``'s ``version``, loaded whole."""
    prefix = str(status.get("prefix", ""))
    return (
        status.get("loaded_version") == version
        and status.get("healthy") is True
        and (not agent or prefix.endswith(f"/{agent}"))
    )


async def _statuses(http: httpx.AsyncClient, engine_url: str) -> list[dict[str, Any]]:
    """The weights extension's status on every engine worker (``[]`` if the engine gives none)."""
    try:
        response = await http.post(f"{engine_url}/collective_rpc", json={"method": "treadle_weights_status"})
    except httpx.HTTPError as exc:
        raise errors.Unavailable(f"POST {engine_url}/collective_rpc: {type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        raise SwapRefused(f"weights status answered HTTP {response.status_code}: {response.text[:300]}")
    try:
        results = response.json().get("results") or []
    except ValueError:
        return []
    return [r for r in results if isinstance(r, dict)]


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
