"""httputil.client's own HTTP/1.1 against a raw socket server: framing, keep-alive, close, cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from treadle import errors
from treadle.services.httputil import client as http
from treadle.testing import procs


class RawServer:
    """Answers each request with the next canned reply; records requests and connections."""

    def __init__(self, replies: list[bytes]) -> None:
        self.replies, self.requests, self.connections = replies, list[bytes](), 0
        self.disconnected, self.received = asyncio.Event(), asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    ),
                    0,
                )
                self.requests.append(head + await reader.readexactly(length))
                self.received.set()
                reply = self.replies.pop(0)
                if not reply:  # never answer: the client gives up
                    await reader.read()
                    self.disconnected.set()
                    return
                writer.write(reply)
                if b"Connection: close" in reply:
                    writer.close()
                    return
        except asyncio.IncompleteReadError:
            self.disconnected.set()
        finally:
            writer.close()


@pytest.fixture
async def raw() -> AsyncIterator[tuple[RawServer, str]]:
    server = RawServer([])
    listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    async with listening:
        yield server, f"http://127.0.0.1:{port}/prefix"


async def test_content_length_chunked_and_keep_alive(raw: tuple[RawServer, str]) -> None:
    server, url = raw
    server.replies += [
        b'HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n{"a": 1}',
        b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{"b"\r\n4;x=y\r\n: 2}\r\n0\r\n\r\n',
        b"HTTP/1.1 204 No Content\r\n\r\n",
    ]
    client = http.new_client(url, timeout_s=5)
    assert await http.call(client, "POST", "/x", json={"q": 1}) == {"a": 1}
    assert await http.call(client, "GET", "/y") == {"b": 2}
    assert await http.call(client, "GET", "/z") is None
    assert server.connections == 1  # one kept-alive connection served all three
    assert server.requests[0].startswith(b"POST /prefix/x HTTP/1.1\r\n")
    assert server.requests[0].endswith(b'\r\n\r\n{"q": 1}')
    await client.aclose()


async def test_connection_close_is_not_reused_and_errors_map(raw: tuple[RawServer, str]) -> None:
    server, url = raw
    body = b'{"error": {"message": "bad", "param": "env"}}'
    server.replies += [
        b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body),
        b"HTTP/1.1 503 Unavailable\r\nContent-Length: 2\r\n\r\n{}",
    ]
    client = http.new_client(url, timeout_s=5)
    with pytest.raises(errors.SpecError) as refused:
        await http.call(client, "POST", "/x", json={})
    assert refused.value.field == "env"
    with pytest.raises(errors.Unavailable):
        await http.call(client, "GET", "/y")
    assert server.connections == 2
    await client.aclose()


async def test_timeout_and_cancel_close_the_connection(raw: tuple[RawServer, str]) -> None:
    server, url = raw
    server.replies += [b"", b""]
    client = http.new_client(url, timeout_s=0.2)
    with pytest.raises(errors.Unavailable, match="timed out"):
        await http.call(client, "GET", "/slow")
    await asyncio.wait_for(server.disconnected.wait(), 5)  # the server saw the client go
    server.disconnected.clear()
    patient = http.new_client(url, timeout_s=60)
    call = asyncio.create_task(http.call(patient, "POST", "/generate", json={}))
    server.received.clear()
    await asyncio.wait_for(server.received.wait(), 5)
    call.cancel()  # the agent's abort: the engine sees the disconnect
    with pytest.raises(asyncio.CancelledError):
        await call
    await asyncio.wait_for(server.disconnected.wait(), 5)
    await client.aclose()
    await patient.aclose()


async def test_refused_connection_is_unavailable() -> None:
    listening = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    listening.close()
    await listening.wait_closed()
    with pytest.raises(errors.Unavailable):
        await http.call(http.new_client(f"http://127.0.0.1:{port}", timeout_s=5), "GET", "/")


async def test_close_delimited_truncated_and_malformed_replies(raw: tuple[RawServer, str]) -> None:
    server, url = raw
    server.replies += [
        b'HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{"c": 3}',  # the body ends where the server closes
        b'HTTP/1.1 200 OK\r\nContent-Length: 50\r\nConnection: close\r\n\r\n{"short"',
        b"HTTQ/9 abc\r\nConnection: close\r\n\r\n",
    ]
    client = http.new_client(url, timeout_s=5)
    assert await http.call(client, "GET", "/a") == {"c": 3}
    with pytest.raises(errors.Unavailable, match="IncompleteReadError"):
        await http.call(client, "GET", "/b")
    with pytest.raises(errors.Unavailable, match="HttpParserError"):
        await http.call(client, "GET", "/c")
    assert server.connections == 3
    await client.aclose()


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"


async def test_a_refused_connection_is_waited_for_within_connect_wait(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A server restarting on its port (refusing, then listening) is waited for, with a log line."""
    port = procs.free_port()
    client = http.new_client(f"http://127.0.0.1:{port}", timeout_s=10.0)
    server = RawServer([OK])

    async def come_back() -> asyncio.Server:
        await asyncio.sleep(0.5)
        return await asyncio.start_server(server.handle, "127.0.0.1", port)

    later = asyncio.create_task(come_back())
    try:
        assert await http.call(client, "POST", "/v1/score", json={}, connect_wait_s=5.0) == {}
        assert "connection refused; waiting up to 5s" in caplog.text
    finally:
        (await later).close()
        await client.aclose()


async def test_a_refused_connection_fails_after_connect_wait_saying_how_long() -> None:
    port = procs.free_port()
    client = http.new_client(f"http://127.0.0.1:{port}", timeout_s=10.0)
    try:
        with pytest.raises(errors.Unavailable, match=r"for 0\.\d+s"):
            await http.call(client, "GET", "/x", connect_wait_s=0.5)
        with pytest.raises(
            errors.Unavailable, match="ConnectionRefusedError"
        ) as refused:  # no wait by default
            await http.call(client, "GET", "/x")
        assert " for " not in str(refused.value)
    finally:
        await client.aclose()
