"""Async client of the environment service; the scheduler holds one per env server (``EnvPool``).

Errors follow ``treadle.services.httputil.client``: ``Unavailable`` (retry with backoff),
``NotFound`` (unknown session), ``SpecError`` (bad input, ``field`` set), ``Conflict``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any
from urllib import parse

import pydantic

from treadle import errors
from treadle.services.env import protocol
from treadle.services.httputil import client as http


class EnvClient:
    """Numbers each session's steps: a call that raised leaves the number unused, so the caller's
    retry of the same action is the same step and the server applies it once."""

    def __init__(self, base_url: str, *, timeout_s: float = 30.0, token: str | None = None) -> None:
        self._http = http.new_client(base_url, timeout_s=timeout_s, token=token)
        self._next_step: dict[str, int] = {}

    async def open(
        self, *, env: str, session_id: str, seed: int, options: dict[str, Any] | None = None
    ) -> protocol.Observation:
        try:
            req = protocol.OpenRequest(env=env, session_id=session_id, seed=seed, options=options)
        except pydantic.ValidationError as exc:
            raise http.from_validation(exc) from exc
        # Counted from the request on, so that ``EnvPool`` does not close the client under an open.
        fresh = session_id not in self._next_step
        self._next_step.setdefault(session_id, 0)
        try:
            body = await http.call(self._http, "POST", "/v1/sessions", json=req.model_dump())
        except BaseException:
            if fresh:
                self._next_step.pop(session_id, None)
            raise
        return protocol.Observation.model_validate(body)

    async def step(self, session_id: str, action: str, *, index: int | None = None) -> protocol.StepResult:
        """Step ``index`` (default: the session's next) of the session."""
        step = self._next_step.get(session_id, 0) if index is None else index
        try:
            body = await http.call(
                self._http, "POST", f"/v1/sessions/{parse.quote(session_id, safe='')}/step",
                json={"action": action, "step": step},
            )  # fmt: skip
        except errors.NotFound:
            self._next_step.pop(session_id, None)  # the session is gone; nothing to number any more
            raise
        self._next_step[session_id] = step + 1
        return protocol.StepResult.model_validate(body)

    async def close(self, session_id: str) -> None:
        try:
            await http.call(self._http, "DELETE", f"/v1/sessions/{parse.quote(session_id, safe='')}")
        finally:
            self._next_step.pop(session_id, None)

    @property
    def open_sessions(self) -> int:
        """Sessions opened (or being opened) through this client and not closed or lost since."""
        return len(self._next_step)

    async def stats(self) -> protocol.SessionStats:
        return protocol.SessionStats.model_validate(await http.call(self._http, "GET", "/v1/stats"))

    async def aclose(self) -> None:
        await self._http.aclose()


class EnvPool:
    """One ``EnvClient`` per env server URL, kept in step with the URLs resolved last (``update``).

    The scheduler opens new sessions on ``clients``; a session keeps the client it was opened on.
    A URL that is no longer resolved is retired: it gets no new session, and its client is closed
    by ``reap`` once its last session has ended, so a pod that only left the Service's endpoints
    (not ready, draining) still finishes the episodes it holds. A URL that comes back before then
    gets its client back.
    """

    def __init__(self, urls: Sequence[str], *, make: Callable[[str], EnvClient] = EnvClient) -> None:
        self._make = make
        self._active: dict[str, EnvClient] = {}
        self._retired: dict[str, EnvClient] = {}
        self.update(urls)

    @property
    def clients(self) -> list[EnvClient]:
        """The clients new sessions go to, in URL order (the scheduler hashes trajectories over it)."""
        return [self._active[url] for url in sorted(self._active)]

    @property
    def urls(self) -> list[str]:
        return sorted(self._active)

    def update(self, urls: Sequence[str]) -> bool:
        """Use ``urls`` from now on; whether the set changed. Empty (nothing resolved) keeps the set."""
        want = set(urls)
        if not want or want == set(self._active):
            return False
        for url in set(self._active) - want:
            self._retired[url] = self._active.pop(url)
        for url in want - set(self._active):
            self._active[url] = self._retired.pop(url) if url in self._retired else self._make(url)
        return True

    async def reap(self) -> list[str]:
        """Close the retired clients that have no session left; their URLs."""
        done = sorted(url for url, client in self._retired.items() if client.open_sessions == 0)
        for url in done:
            await self._retired.pop(url).aclose()
        return done

    async def aclose(self) -> None:
        for client in [*self._active.values(), *self._retired.values()]:
            await client.aclose()
        self._active.clear()
        self._retired.clear()
