"""Relaying an ASGI (FastAPI) websocket or GET request to a websocket server, frame for frame: how a fleet
replica's ingress (`serving/ray_app.py`) reaches the server it runs, so protocol, limits and checks stay
that server's; and `fan_in`, which merges several servers' streams (every replica's `/text`) into one."""

import asyncio
import contextlib
import logging
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Mapping

from fastapi import Request, WebSocket
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

logger = logging.getLogger(__name__)

# Request headers the server reads (its API key check).
FORWARDED_HEADERS = ("authorization",)
# The close code for a handshake the server refused (full, or draining): try again later.
TRY_AGAIN_LATER = 1013


async def join(client: WebSocket, url: str) -> None:
    """Connects to `url`, then relays every frame both ways until either side closes, and closes the other
    with the same code and reason. A handshake the server refuses closes the client's before it opens."""
    try:
        server = await connect(
            url,
            additional_headers=forwarded(client.headers),
            max_size=None,  # the server enforces its own limit (and closes with 1009)
            compression=None,
        )
    except InvalidStatus as refused:
        logger.info("%s refused a connection: HTTP %d", url, refused.response.status_code)
        await client.close(TRY_AGAIN_LATER)
        return
    await client.accept()
    async with server:
        upstream = asyncio.ensure_future(_client_to_server(client, server))
        downstream = asyncio.ensure_future(_server_to_client(server, client))
        await asyncio.wait({upstream, downstream}, return_when=asyncio.FIRST_COMPLETED)
        for pump in (upstream, downstream):
            pump.cancel()
        await asyncio.gather(upstream, downstream, return_exceptions=True)


async def forward_get(request: Request, base_url: str) -> tuple[int, bytes, str | None]:
    """The server's answer (status, body, content type) to `request`'s path, asked with its headers."""
    url = base_url + request.url.path
    return await asyncio.to_thread(_get, url, forwarded(request.headers))


def forwarded(headers: Mapping[str, str]) -> dict[str, str]:
    return {name: headers[name] for name in FORWARDED_HEADERS if name in headers}


def _get(url: str, headers: dict[str, str]) -> tuple[int, bytes, str | None]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read(), response.headers.get("Content-Type")
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers.get("Content-Type")


async def _client_to_server(client: WebSocket, server: ClientConnection) -> None:
    while True:
        message = await client.receive()
        if message["type"] == "websocket.disconnect":
            await server.close(message.get("code", 1000))
            return
        await server.send(message["bytes"] if message.get("bytes") is not None else message["text"])


async def _server_to_client(server: ClientConnection, client: WebSocket) -> None:
    with contextlib.suppress(ConnectionClosed):
        async for message in server:
            if isinstance(message, bytes):
                await client.send_bytes(message)
            else:
                await client.send_text(message)
    with contextlib.suppress(RuntimeError):  # the client is gone already
        await client.close(server.close_code or 1000, server.close_reason or "")


async def fan_in(
    client: WebSocket, sources: Callable[[], Awaitable[list[str]]], refresh_s: float = 2.0
) -> None:
    """Relays every frame of every server `sources()` names (asked again every `refresh_s`, so servers
    that start later join and a server that went away is tried again) to `client`, until it closes."""
    await client.accept()
    frames: asyncio.Queue[str | bytes] = asyncio.Queue()
    readers: dict[str, asyncio.Task] = {}
    headers = forwarded(client.headers)

    async def read(url: str) -> None:
        with contextlib.suppress(OSError, InvalidHandshake, ConnectionClosed):
            async with connect(url, additional_headers=headers, max_size=None, compression=None) as server:
                async for message in server:
                    frames.put_nowait(message)

    async def refresh() -> None:
        while True:
            for url in await sources():
                if url not in readers or readers[url].done():
                    readers[url] = asyncio.ensure_future(read(url))
            await asyncio.sleep(refresh_s)

    async def forward() -> None:
        while True:
            message = await frames.get()
            await (client.send_bytes(message) if isinstance(message, bytes) else client.send_text(message))

    async def until_closed() -> None:
        while (await client.receive())["type"] != "websocket.disconnect":
            pass

    pumps = [asyncio.ensure_future(pump()) for pump in (refresh, forward, until_closed)]
    try:
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (*pumps, *readers.values()):
            task.cancel()
        await asyncio.gather(*pumps, *readers.values(), return_exceptions=True)
