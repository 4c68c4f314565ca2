"""Session table of the env service: open / step / close, isolation of slow and failing envs.

Called by ``http_app`` routes. Each session steps under its own timeout; an environment that raises
or times out loses only its own session, which is dropped and remembered (bounded) with the reason,
so a retried step gets ``NotFound`` naming it and the scheduler can mark the trajectory failed.
Re-opening an existing session with the same (env, seed, options) before any step returns its first
observation again, so a retried ``open`` is safe. Idle sessions are reaped after ``idle_ttl_s``.

Steps are idempotent by index: step ``i`` of a session is applied once. A retry of the step in
flight (the caller timed out, or its connection dropped) joins it; a retry of the last applied step
(its reply was lost) gets the cached result; any other index, or a known index with another
action, is a ``Conflict`` that names the expected index. A step keeps running when its caller
goes away, so the retry finds its result instead of applying the action twice.

A step whose environment declares tools (``base.UsesTools``) first holds the job's API quotas for
them (``quotas``), outside the step's timeout: it waits its turn instead of failing.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import prometheus_client

from treadle import errors, metrics
from treadle.services import plugin
from treadle.services.env import base, frozenlake, mathtool, protocol, pythoncode
from treadle.services.env import quotas as quotas_mod

log = logging.getLogger(__name__)

BUILTIN: dict[str, base.Spec] = {s.name: s for s in (mathtool.SPEC, pythoncode.SPEC, frozenlake.SPEC)}


@dataclasses.dataclass
class Session:
    env_name: str
    seed: int
    options: dict[str, Any]
    env: base.Environment
    first: protocol.Observation
    last_used: float
    steps: int = 0
    """Steps applied; the next one must carry this index."""
    last: tuple[str, protocol.StepResult] | None = None
    """Action and result of step ``steps - 1``, replayed to a retry whose reply was lost."""
    running: tuple[int, str, asyncio.Task[protocol.StepResult]] | None = None
    """Index, action and task of the step being applied."""

    @property
    def busy(self) -> bool:
        return self.running is not None


class EnvService:
    def __init__(
        self,
        *,
        registry: prometheus_client.CollectorRegistry,
        context: base.Context,
        specs: Mapping[str, base.Spec] = BUILTIN,
        user_prefixes: tuple[str, ...] = (),
        max_sessions: int = 10_000,
        step_timeout_s: float = 30.0,
        idle_ttl_s: float = 900.0,
        clock: Callable[[], float] = time.monotonic,
        quotas: quotas_mod.Quotas | None = None,
    ) -> None:
        self.specs = dict(specs)
        self.quotas = quotas
        """The job's API quotas (None: the job has none, and no tool is limited)."""
        self.user_prefixes = user_prefixes
        """Module prefixes user environments (``py:<module>:<Class>``) may be imported from."""
        self.context = context
        self.max_sessions, self.step_timeout_s, self.idle_ttl_s = max_sessions, step_timeout_s, idle_ttl_s
        self.clock = clock
        self.sessions: dict[str, Session] = {}
        self.failed: collections.OrderedDict[str, str] = collections.OrderedDict()
        self.opened = 0
        self.failures = 0
        self.replays = 0
        """Steps answered from a retry's join or the cache rather than applied again."""
        self._active = prometheus_client.Gauge(
            metrics.ENV_SESSIONS_ACTIVE, "Open env sessions", ["env"], registry=registry
        )
        self._opened = prometheus_client.Counter(
            metrics.ENV_SESSIONS_OPENED_TOTAL, "Env sessions opened", ["env"], registry=registry
        )
        self._step_seconds = prometheus_client.Histogram(
            metrics.ENV_STEP_SECONDS, "Env step latency", ["env"], registry=registry,
            buckets=(0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30),
        )  # fmt: skip
        self._failures = prometheus_client.Counter(
            metrics.ENV_FAILURES_TOTAL,
            "Env steps that raised or timed out",
            ["env", "kind"],
            registry=registry,
        )

    async def open(self, req: protocol.OpenRequest) -> protocol.Observation:
        spec = self._spec(req.env)
        options = req.options or {}
        existing = self.sessions.get(req.session_id)
        if existing is not None:
            if (existing.env_name, existing.seed, existing.options) == (req.env, req.seed, options) and (
                existing.steps == 0
            ):
                return existing.first
            raise errors.Conflict(f"session {req.session_id!r} is already open with other settings or steps")
        if len(self.sessions) >= self.max_sessions:
            raise errors.Unavailable(f"at capacity ({self.max_sessions} sessions)")
        env = spec.factory(req.seed, options, self.context)  # SpecError on bad options: nothing stored
        try:
            text, info = await asyncio.wait_for(env.reset(), self.step_timeout_s)
        except Exception as exc:
            await self._discard(env)
            raise self._failure(req.env, "reset", req.session_id, exc) from exc
        first = protocol.Observation(session_id=req.session_id, observation=text, info=info)
        self.sessions[req.session_id] = Session(req.env, req.seed, options, env, first, self.clock())
        self.failed.pop(req.session_id, None)
        self.opened += 1
        self._opened.labels(req.env).inc()
        self._active.labels(req.env).inc()
        return first

    def _spec(self, name: str) -> base.Spec:
        """A built-in, or a user environment ``py:<module>:<Class>`` (imported once, then kept)."""
        if (spec := self.specs.get(name)) is not None:
            return spec
        if not name.startswith(plugin.PREFIX):
            raise errors.SpecError(
                f"unknown environment {name!r}; known: {sorted(self.specs)} or py:MODULE:CLASS", field="env"
            )
        factory = plugin.load(name, self.user_prefixes, what="user environment", field="env")
        if not callable(factory):
            raise errors.SpecError(f"{name!r} is not a class or function", field="env")
        doc = (factory.__doc__ or "").strip()
        spec = base.Spec(name, doc.splitlines()[0] if doc else "user environment", factory)
        self.specs[name] = spec
        return spec

    async def step(self, session_id: str, action: str, *, index: int) -> protocol.StepResult:
        """Apply step ``index`` of the session once; retries of it get the same result."""
        session = self._get(session_id)
        if session.running is not None:
            running_index, running_action, task = session.running
            if (index, action) != (running_index, running_action):
                raise errors.Conflict(
                    f"session {session_id!r} is applying step {running_index}; step {index} must wait for it"
                )
            self.replays += 1
            return await asyncio.shield(task)
        if index == session.steps - 1 and session.last is not None:
            if session.last[0] != action:
                raise errors.Conflict(
                    f"step {index} of session {session_id!r} was applied with another action"
                )
            self.replays += 1
            return session.last[1]
        if index != session.steps:
            raise errors.Conflict(
                f"step {index} of session {session_id!r} is out of order: {session.steps} applied, "
                f"the next is {session.steps}"
            )
        task = asyncio.create_task(self._apply(session_id, session, action))
        # Retrieved here too, so a step whose every caller left does not log "never retrieved".
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        session.running = (index, action, task)
        # Shielded: a caller that goes away leaves the step to finish, and its retry to find the result.
        return await asyncio.shield(task)

    async def _apply(self, session_id: str, session: Session, action: str) -> protocol.StepResult:
        tools = session.env.tools_for(action) if isinstance(session.env, base.UsesTools) else []
        try:
            # The quota is held for the whole step, outside its timeout: waiting in the queue is no fault.
            async with self._quota(tools):
                started = self.clock()
                outcome = await asyncio.wait_for(session.env.step(action), self.step_timeout_s)
        except Exception as exc:
            await self._drop(session_id)
            raise self._failure(session.env_name, "step", session_id, exc) from exc
        finally:
            session.running = None
        now = self.clock()
        self._step_seconds.labels(session.env_name).observe(now - started)
        result = protocol.StepResult(
            observation=outcome.observation, done=outcome.done, reward=outcome.reward, info=outcome.info
        )
        session.steps += 1
        session.last = (action, result)
        session.last_used = now
        return result

    def _quota(self, tools: list[str]) -> contextlib.AbstractAsyncContextManager[object]:
        if self.quotas is None or not tools:
            return contextlib.nullcontext()
        return self.quotas.hold(tools)

    async def close(self, session_id: str) -> None:
        self._get(session_id)
        await self._drop(session_id)

    def stats(self) -> protocol.SessionStats:
        return protocol.SessionStats(
            active=len(self.sessions),
            opened=self.opened,
            failed=self.failures,
            max_sessions=self.max_sessions,
        )

    async def reap(self) -> list[str]:
        """Close sessions idle for longer than ``idle_ttl_s`` (their scheduler is gone)."""
        cutoff = self.clock() - self.idle_ttl_s
        stale = [sid for sid, s in self.sessions.items() if s.last_used < cutoff and not s.busy]
        for sid in stale:
            await self._drop(sid)
        return stale

    async def close_all(self) -> None:
        for sid in list(self.sessions):
            await self._drop(sid)

    def _get(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            reason = self.failed.get(session_id)
            suffix = f": it failed earlier: {reason}" if reason else ""
            raise errors.NotFound(f"session {session_id!r} is not open{suffix}")
        return session

    async def _drop(self, session_id: str) -> None:
        session = self.sessions.pop(session_id, None)
        if session is not None:
            self._active.labels(session.env_name).dec()
            await self._discard(session.env)

    async def _discard(self, env: base.Environment) -> None:
        try:
            await asyncio.wait_for(env.close(), self.step_timeout_s)
        except Exception:
            log.warning("env close failed", exc_info=True)

    def _failure(self, env_name: str, what: str, session_id: str, exc: BaseException) -> errors.TreadleError:
        if isinstance(exc, errors.TreadleError) and not isinstance(exc, errors.Unavailable):
            return exc  # bad input from the env's own validation: the caller's fault, not the env's
        kind = "timeout" if isinstance(exc, TimeoutError) else "error"
        reason = (
            f"{what} timed out after {self.step_timeout_s}s"
            if kind == "timeout"
            else f"{what} raised {type(exc).__name__}: {exc}"
        )
        self.failures += 1
        self._failures.labels(env_name, kind).inc()
        self.failed[session_id] = reason
        while len(self.failed) > 10_000:
            self.failed.popitem(last=False)
        log.warning("env %s session %s: %s", env_name, session_id, reason)
        return errors.Unavailable(f"environment {env_name!r} session {session_id!r}: {reason}")
