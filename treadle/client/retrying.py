"""Waiting out a Treadle service that is not answering yet (starting, restarting), for the SDK: the
connection (``connect.wait_for``) and the batch iterator (``batches.Batches``), so a trainer rides
out a buffer or scheduler restart instead of dying with it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from treadle import errors

log = logging.getLogger(__name__)
T = TypeVar("T")


async def wait_for(
    call: Callable[[], Awaitable[T]],
    *,
    what: str,
    timeout_s: float = 300.0,
    first_wait_s: float = 0.5,
    max_wait_s: float = 10.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """``call()``'s answer, trying again while it raises ``Unavailable`` (``what``, e.g. "the scheduler
    at learn-scheduler:50051", not up yet): waits double from ``first_wait_s`` to ``max_wait_s``, each
    logged with what it waits for; ``Unavailable`` naming ``what`` once ``timeout_s`` would pass."""
    began = clock()
    wait = first_wait_s
    while True:
        try:
            return await call()
        except errors.Unavailable as exc:
            waited = clock() - began
            if waited + wait > timeout_s:
                raise errors.Unavailable(f"{what} did not answer within {timeout_s:g}s: {exc}") from exc
            log.info("waiting for %s (%.0fs so far, next try in %.1fs): %s", what, waited, wait, exc)
            await sleep(wait)
            wait = min(wait * 2, max_wait_s)
