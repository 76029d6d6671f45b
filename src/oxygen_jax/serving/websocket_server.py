"""Websocket policy server that unmodified openpi clients (``WebsocketClientPolicy``) talk to.

Protocol, as openpi speaks it: on connect the server sends the backend's metadata, then answers each
binary msgpack-numpy observation with one binary msgpack-numpy result. Each result carries
``server_timing = {"infer_ms", "prev_total_ms"}`` (the latter from the second request on: the previous
request's time from receipt until its reply was sent) and ``policy_timing = {"infer_ms"}``, which the
server fills with the backend call time unless the backend reports its own. ``GET /healthz`` on the same
port answers 200 over plain HTTP; ``GET /readyz`` 200 once the backend is ready (its ``ready``, e.g. warm-up
done; a backend without one always is) and 503 before that and while draining; ``GET /metrics`` the
backend's Prometheus metrics (`serving/metrics.py`; 404 without any).

A backend with ``subscribe_text(listener)`` also streams text: a websocket client of ``/text`` (optionally
``/text?robot_id=<id>`` for one robot) receives one binary msgpack message per text event the backend
reports, as it happens, and sends nothing. Without such a backend ``/text`` answers HTTP 404.

Errors are text frames, because an openpi client raises ``RuntimeError`` carrying the text of any text
frame it receives instead of a result. A bad request (an undecodable message, an observation that is not a
map or nested too deep, or a backend raising `InvalidRequest`) gets one line, ``"Bad request: ... (error
id ...)"``, logged at INFO. Anything else the backend raises is a server fault: ``"Internal server error:
<type> (error id ...)"``, its traceback logged at ERROR under the same id (``ServerLimits.debug_errors``
also sends it). Either way the connection keeps serving.

Resources are bounded by `ServerLimits`: the message size (a bigger message closes the connection with
1009 and a one-line reason), the number of open connections (more get HTTP 503 at the handshake), and an
idle timeout (a connection that sends nothing for that long is closed with 1001).

Each connection handles its requests in order, but connections are served concurrently, so requests from
different clients reach the backend at the same time and a batching backend can group them. A backend with
``async def infer_async(obs)`` is awaited on the event loop; otherwise ``infer`` runs on a pool of
``infer_workers`` threads (default 1, because a plain policy need not be thread-safe).
"""

import asyncio
import contextlib
import dataclasses
import http
import logging
import signal
import threading
import time
import traceback
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from websockets.asyncio.server import Request, Response, ServerConnection
from websockets.asyncio.server import serve as _ws_serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode

from oxygen_jax.errors import InvalidRequest
from oxygen_jax.serving import metrics, msgpack_numpy

logger = logging.getLogger(__name__)


class PolicyBackend(Protocol):
    """What the server serves: metadata for new clients and one result per observation."""

    @property
    def metadata(self) -> dict: ...

    def infer(self, obs: dict) -> dict: ...


class AsyncPolicyBackend(PolicyBackend, Protocol):
    """A backend that awaits requests on the event loop, e.g. to batch those from several clients."""

    async def infer_async(self, obs: dict) -> dict: ...


class TextStreamBackend(PolicyBackend, Protocol):
    """A backend that pushes text events: `listener(message)` may be called from any thread; the call
    returns the function that unsubscribes."""

    def subscribe_text(self, listener: Callable[[dict], None]) -> Callable[[], None]: ...


TEXT_PATH = "/text"


class BadRequestError(Exception):
    """The client's fault: reported to it, and its connection keeps serving."""


# Observations are maps of arrays a few levels deep (openpi's ALOHA `images/<camera>` is the deepest).
MAX_NESTING = 8


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """What one server accepts; None switches a limit off."""

    # Three 1280x720 uint8 cameras take 8.3 MB and four 480x640 float32 ones 14.7 MB.
    max_message_mb: float | None = 16.0
    max_connections: int | None = 64
    idle_timeout_s: float | None = 300.0
    debug_errors: bool = False


@contextlib.asynccontextmanager
async def open_server(
    backend: PolicyBackend,
    host: str,
    port: int,
    *,
    infer_workers: int = 1,
    limits: ServerLimits = ServerLimits(),
) -> AsyncIterator[int]:
    """Serve ``backend`` on the running loop while the block runs; yields the bound port.

    Leaving the block drains the server: it stops accepting, answers every request already received,
    then closes every connection.
    """
    executor = ThreadPoolExecutor(infer_workers, thread_name_prefix="policy-infer")
    handler = _ConnectionHandler(backend, _backend_caller(backend, executor), limits)
    max_size = None if limits.max_message_mb is None else int(limits.max_message_mb * 2**20)
    try:
        async with _ws_serve(
            handler, host, port, compression=None, max_size=max_size, process_request=handler.admit
        ) as server:
            try:
                yield server.sockets[0].getsockname()[1]
            finally:
                server.close(close_connections=False)  # stop accepting, then drain
                await handler.drain()
    finally:
        executor.shutdown()


def serve(
    backend: PolicyBackend,
    host: str = "0.0.0.0",
    port: int = 8000,
    *,
    infer_workers: int = 1,
    limits: ServerLimits = ServerLimits(),
) -> None:
    """Serve until SIGINT or SIGTERM, then drain (see `open_server`); a second signal forces the exit."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def on_signal() -> None:
            stop.set()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
                signal.signal(sig, signal.SIG_DFL)  # a second signal ends the process at once

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        async with open_server(backend, host, port, infer_workers=infer_workers, limits=limits) as bound_port:
            logger.info("Serving policy on ws://%s:%d", host, bound_port)
            await stop.wait()
            logger.info("Shutting down")

    asyncio.run(main())


class BackgroundServer:
    """A server on its own event loop thread, for tests and for embedding in synchronous programs."""

    def __init__(
        self,
        backend: PolicyBackend,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        infer_workers: int = 1,
        limits: ServerLimits = ServerLimits(),
    ) -> None:
        self._backend = backend
        self._limits = limits
        self._host = host
        self._requested_port = port
        self._infer_workers = infer_workers
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._port: int | None = None
        self._error: Exception | None = None

    @property
    def port(self) -> int:
        """The bound port (the one the OS chose when constructed with port 0)."""
        if self._port is None:
            raise RuntimeError("server is not running")
        return self._port

    def start(self, timeout: float = 30.0) -> "BackgroundServer":
        """Start serving and return once the port is bound; a startup error is raised here."""
        if self._thread is not None:
            raise RuntimeError("server already started")
        self._ready.clear()
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), name="policy-server")
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("server did not start in time")
        if self._port is None:
            self._join(timeout)  # Startup failed: raises its error.
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Close all connections and stop serving, after in-flight requests finish; idempotent."""
        if self._thread is None:
            return
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._join(timeout)

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _join(self, timeout: float) -> None:
        """Wait for the server thread, then re-raise what stopped it, if anything did."""
        thread = self._thread
        if thread is None:
            return
        thread.join(timeout)
        if thread.is_alive():
            raise TimeoutError("server did not stop in time")
        self._thread = None
        self._port = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            async with open_server(
                self._backend,
                self._host,
                self._requested_port,
                infer_workers=self._infer_workers,
                limits=self._limits,
            ) as port:
                self._port = port
                self._ready.set()
                await self._stop.wait()
        except Exception as error:
            self._error = error
        finally:
            self._ready.set()


def _backend_caller(
    backend: PolicyBackend, executor: ThreadPoolExecutor
) -> Callable[[dict], Awaitable[dict]]:
    infer_async = getattr(backend, "infer_async", None)
    if infer_async is not None:
        return infer_async

    async def call_in_thread(obs: dict) -> dict:
        return await asyncio.get_running_loop().run_in_executor(executor, backend.infer, obs)

    return call_in_thread


class _ConnectionHandler:
    """Runs one client's session: metadata first, then one reply per request, in order."""

    def __init__(
        self, backend: PolicyBackend, infer: Callable[[dict], Awaitable[dict]], limits: ServerLimits
    ) -> None:
        self._backend = backend
        self._infer = infer
        self._limits = limits
        self._open = 0
        self._busy: dict[ServerConnection, bool] = {}  # connection -> a request of it is being answered
        self._draining = False

    async def drain(self) -> None:
        """Stops taking requests: idle connections close now, busy ones right after their reply."""
        self._draining = True
        idle = [websocket for websocket, busy in self._busy.items() if not busy]
        await asyncio.gather(
            *(websocket.close(CloseCode.GOING_AWAY, "server shutting down") for websocket in idle)
        )
        while any(self._busy.values()):
            await asyncio.sleep(0.01)

    def admit(self, connection: ServerConnection, request: Request) -> Response | None:
        """The handshake hook: health checks, and a refusal once `max_connections` are open."""
        path = urllib.parse.urlsplit(request.path).path
        if path == "/healthz":
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        if path == "/readyz":
            ready = getattr(self._backend, "ready", True) and not self._draining
            status = http.HTTPStatus.OK if ready else http.HTTPStatus.SERVICE_UNAVAILABLE
            return connection.respond(status, "ready\n" if ready else "not ready\n")
        if path == "/metrics":
            return metrics.respond(connection, self._backend)
        if path == TEXT_PATH and not hasattr(self._backend, "subscribe_text"):
            return connection.respond(http.HTTPStatus.NOT_FOUND, "This server streams no text\n")
        if self._limits.max_connections is not None and self._open >= self._limits.max_connections:
            logger.warning("Refused %s: %d connections open", connection.remote_address, self._open)
            message = f"Too many connections (at most {self._limits.max_connections})\n"
            return connection.respond(http.HTTPStatus.SERVICE_UNAVAILABLE, message)
        return None

    async def __call__(self, websocket: ServerConnection) -> None:
        logger.info("Connection from %s opened", websocket.remote_address)
        self._open += 1
        self._busy[websocket] = False
        try:
            url = urllib.parse.urlsplit(websocket.request.path)
            if url.path == TEXT_PATH:
                await self._stream_text(websocket, urllib.parse.parse_qs(url.query).get("robot_id"))
                return
            await websocket.send(msgpack_numpy.packb(self._backend.metadata))
            prev_total_ms: float | None = None
            while not self._draining:
                try:
                    async with asyncio.timeout(self._limits.idle_timeout_s):
                        message = await websocket.recv()
                except TimeoutError:
                    reason = f"idle for {self._limits.idle_timeout_s:g} s"
                    logger.info("Closing %s: %s", websocket.remote_address, reason)
                    await websocket.close(CloseCode.GOING_AWAY, reason)
                    return
                self._busy[websocket] = True
                received = time.monotonic()
                error_kind = None
                try:
                    reply = await self._answer(message, prev_total_ms)
                except Exception as error:
                    reply, error_kind = self._error_line(websocket, error), _error_kind(error)
                await websocket.send(reply)
                metrics.record(self._backend, time.monotonic() - received, error_kind)
                self._busy[websocket] = False
                if isinstance(reply, bytes):
                    prev_total_ms = (time.monotonic() - received) * 1000
            await websocket.close(CloseCode.GOING_AWAY, "server shutting down")
        except ConnectionClosed:
            pass
        finally:
            self._open -= 1
            del self._busy[websocket]
            logger.info("Connection from %s closed", websocket.remote_address)

    async def _stream_text(self, websocket: ServerConnection, robot_ids: list[str] | None) -> None:
        """Sends each text event (of the robots in `robot_ids`, default all) until the client or the
        server closes."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[dict] = asyncio.Queue()

        def listener(message: dict) -> None:
            if robot_ids is None or message.get("robot_id") in robot_ids:
                loop.call_soon_threadsafe(events.put_nowait, message)

        unsubscribe = self._backend.subscribe_text(listener)
        closed = asyncio.ensure_future(websocket.wait_closed())
        try:
            while True:
                event = asyncio.ensure_future(events.get())
                await asyncio.wait({event, closed}, return_when=asyncio.FIRST_COMPLETED)
                if not event.done():
                    event.cancel()
                    return
                await websocket.send(msgpack_numpy.packb(event.result()))
        finally:
            unsubscribe()
            closed.cancel()

    def _error_line(self, websocket: ServerConnection, error: Exception) -> str:
        """One line for the client; the traceback goes to the log under the same error id."""
        error_id = uuid.uuid4().hex[:8]
        if isinstance(error, BadRequestError):
            logger.info("Bad request from %s [%s]: %s", websocket.remote_address, error_id, error)
            line = f"Bad request: {error} (error id {error_id})"
        else:
            logger.error("Request from %s failed [%s]", websocket.remote_address, error_id, exc_info=error)
            line = f"Internal server error: {type(error).__name__} (error id {error_id})"
        if self._limits.debug_errors:
            line += "\n" + "".join(traceback.format_exception(error))
        return line

    async def _answer(self, message: str | bytes, prev_total_ms: float | None) -> bytes:
        obs = _decode_request(message)
        start = time.monotonic()
        try:
            result = await self._infer(obs)
        except InvalidRequest as error:
            raise BadRequestError(" ".join(str(error).split())) from error
        infer_ms = (time.monotonic() - start) * 1000
        if not isinstance(result, dict):
            raise TypeError(f"backend returned {type(result).__name__}, expected dict")
        server_timing = {"infer_ms": infer_ms}
        if prev_total_ms is not None:
            server_timing["prev_total_ms"] = prev_total_ms
        reply = {"policy_timing": {"infer_ms": infer_ms}, **result, "server_timing": server_timing}
        return msgpack_numpy.packb(reply)


def _error_kind(error: Exception) -> str:
    """The client's fault ("bad_request") or the server's ("internal")."""
    return "bad_request" if isinstance(error, BadRequestError) else "internal"


def _decode_request(message: str | bytes) -> dict:
    if isinstance(message, str):
        raise BadRequestError("expected a binary msgpack frame, got a text frame")
    try:
        obs: Any = msgpack_numpy.unpackb(message)
    except Exception as error:
        reason = f"{type(error).__name__}: {error}"
        raise BadRequestError(f"undecodable msgpack-numpy message ({reason})") from error
    if not isinstance(obs, dict):
        raise BadRequestError(f"observation must be a map, got {type(obs).__name__}")
    if _depth(obs) > MAX_NESTING:
        raise BadRequestError(f"observation nested deeper than {MAX_NESTING} levels")
    return obs


def _depth(value: Any) -> int:
    """Nesting depth of maps and lists, without recursion (msgpack allows about a thousand levels)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list | tuple):
            deepest = max(deepest, depth)
            if depth <= MAX_NESTING:
                stack.extend(
                    (child, depth + 1) for child in (item.values() if isinstance(item, dict) else item)
                )
    return deepest
