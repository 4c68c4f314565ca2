"""A sandboxed process's channel to the service (two pipes beside stdin/stdout), and the relay that
joins two processes' channels; used by ``runner.Sandbox`` (``run_connected``).

Every started process, warm ones included, gets its channel at start: the fds it reads and writes
are named by ``CHANNEL_IN`` / ``CHANNEL_OUT`` in its environment. A plain run leaves it unused. A
connected run relays each side's output to the other's input in the service, so the two processes
share no pipe, fd or file, and when one side ends (or closes its output) the other reads EOF.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os

CHANNEL_IN, CHANNEL_OUT = "TREADLE_CHANNEL_IN", "TREADLE_CHANNEL_OUT"
"""The variables that name the fds a process reads from and writes to its peer."""
CHUNK = 65536


@dataclasses.dataclass
class Channel:
    """The service's ends (non-blocking) and the fds the child got for its own."""

    to_child: int
    from_child: int
    child_in: int
    child_out: int

    @property
    def variables(self) -> dict[str, str]:
        return {CHANNEL_IN: str(self.child_in), CHANNEL_OUT: str(self.child_out)}

    def close(self) -> None:
        for fd in (self.to_child, self.from_child):
            with contextlib.suppress(OSError):  # the relay may have closed to_child already
                os.close(fd)


def open_channel() -> Channel:
    """Two pipes; pass ``child_in`` and ``child_out`` to the child, then ``close_child_ends``."""
    child_in, to_child = os.pipe()
    from_child, child_out = os.pipe()
    for fd in (to_child, from_child):
        os.set_blocking(fd, False)
    return Channel(to_child, from_child, child_in, child_out)


def close_child_ends(channel: Channel) -> None:
    os.close(channel.child_in)
    os.close(channel.child_out)


async def relay(source: Channel, target: Channel) -> None:
    """Copy what ``source`` writes to ``target``'s input until EOF (or ``target`` is gone), then close
    ``target``'s input so that it reads EOF too."""
    try:
        while chunk := await _read(source.from_child):
            view = memoryview(chunk)
            while view:
                view = view[await _write(target.to_child, view) :]
    except BrokenPipeError:
        pass  # the target ended: nothing more to tell it
    finally:
        with contextlib.suppress(OSError):
            os.close(target.to_child)


async def _read(fd: int) -> bytes:
    while True:
        try:
            return os.read(fd, CHUNK)
        except BlockingIOError:
            await _ready(fd, reading=True)


async def _write(fd: int, data: memoryview) -> int:
    while True:
        try:
            return os.write(fd, data)
        except BlockingIOError:
            await _ready(fd, reading=False)


async def _ready(fd: int, *, reading: bool) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    add, remove = (loop.add_reader, loop.remove_reader) if reading else (loop.add_writer, loop.remove_writer)

    def wake() -> None:  # level-triggered: it may fire again before the waiter resumes
        if not ready.done():
            ready.set_result(None)

    add(fd, wake)
    try:
        await ready
    finally:
        remove(fd)
