"""A TCP relay from the bridge gateway to the API server on 127.0.0.1, for in-cluster clients.

Pods get ``KUBERNETES_SERVICE_HOST=kubernetes.default.svc.cluster.local`` (the cluster DNS answers
it with the gateway) and ``KUBERNETES_SERVICE_PORT=443``: the API server listens on loopback only,
which a pod's network namespace cannot reach, and its certificate names
``kubernetes.default.svc.cluster.local`` but not the gateway's address. TLS passes through
untouched, so clients verify the API server itself with the projected ``ca.crt``.
"""

from __future__ import annotations

import asyncio
import contextlib


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()


async def serve(host: str, port: int, target_port: int) -> asyncio.Server:
    """Relay every connection to ``host:port`` to ``127.0.0.1:target_port``."""

    async def relay(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_pipe(client_r, server_w), _pipe(server_r, client_w))

    return await asyncio.start_server(relay, host, port)
