"""Websocket policy server that unmodified openpi clients (``WebsocketClientPolicy``) talk to.

Protocol, as openpi speaks it: on connect the server sends the backend's metadata, then answers each
binary msgpack-numpy observation with one binary msgpack-numpy result. Each result carries
``server_timing = {"infer_ms", "prev_total_ms"}`` (the latter from the second request on: the previous
request's time from receipt until its reply was sent) and ``policy_timing = {"infer_ms"}``, which the
server fills with the backend call time unless the backend reports its own. On the same port over plain
HTTP, ``GET /healthz`` answers 200 while the process serves, and ``GET /readyz`` 200 "ready" only when the
backend says it is ready (its ``ready``, if it has one), the server is not draining and a robot slot is
free (else 503 and the reason).
``GET /metrics`` answers the backend's Prometheus metrics (`serving/metrics.py`; 404 without any;
the API key when one is set).

A backend with ``subscribe_text(listener)`` also streams text: a websocket client of ``/text`` (optionally
``/text?robot_id=<id>`` for one robot) receives one binary msgpack message per text event the backend
reports, as it happens. Without such a backend ``/text`` answers HTTP 404.

Errors are text frames, because an openpi client raises ``RuntimeError`` carrying the text of any text
frame it receives instead of a result. A bad request (an undecodable message, an observation that is not a
map or too big a structure, see `request_decoding`, or a backend raising `InvalidRequest`) gets one line,
``"Bad request: ... (error id ...)"``, logged at INFO once per connection and ``LOG_INTERVAL_S`` (one line
counts the rest). Anything else the backend raises is a server fault:
``"Internal server error: <type> (error id ...)"``, its traceback logged at ERROR under the same id
(``ServerLimits.debug_errors`` also sends it). Either way the connection keeps serving.

No client can stall or lock out the others (`ServerLimits`):
- work before validation is bounded: a message over ``max_message_mb`` closes its connection with 1009;
  decoding is linear in the message's bytes and bounded in objects (`request_decoding`), so it runs on the
  event loop in milliseconds;
- robot connections and ``/text`` subscribers have separate caps (``max_connections``,
  ``max_text_subscribers``; more get HTTP 503 at the handshake), and ``max_connections_per_ip`` caps one
  address (off by default: behind a reverse proxy every client has the proxy's address);
- a robot connection that sends nothing for ``idle_timeout_s`` is closed with 1001, and so is a
  subscriber that was sent no event and sent nothing for as long; a subscriber that stops reading is
  closed with 1008 (policy violation: it broke the stream's terms; 1011 would say the server failed)
  once an event waits unsent for ``idle_timeout_s`` or ``MAX_UNSENT_EVENTS`` wait for it. websockets
  hands fragments over as they arrive (``recv_streaming``), so a message must arrive whole within
  ``receive_timeout_s`` of its first frame, or its connection is closed with 1008 (a trickled single
  frame is bounded by the idle timeout, as no part of it is handed over before its end);
- with ``api_key`` set, robot connections and ``/text`` need the header openpi-client sends for its
  ``api_key`` (`AUTH_HEADER`), or an unexpired ticket minted with the key in the query (``?ticket=``,
  `serving/tickets.py`: what a fleet's ingress redirects a robot with), else HTTP 401; an address that
  failed ``FAILED_KEY_BURST`` times gets HTTP 429 until it may try again (``FAILED_KEY_RATE`` a second),
  held until then (at most ``REFUSAL_HOLD_S``, ``MAX_HELD_REFUSALS`` at once) with ``Retry-After``.
  ``/healthz`` and ``/readyz`` stay open. The ``Server`` header names no versions;
- what a client makes the server hold or do is bounded (`flow_control`): requests received and not yet
  answered, in bytes per connection (``max_pending_mb``) and in all (``max_pending_total_mb``; past
  either, reading pauses and TCP pushes back, but a connection with nothing pending is always read; each
  frame counts ``FRAME_CHARGE`` bytes more than its payload, so a flood of tiny frames is bounded too;
  a socket read reaches websockets' parser a slice per turn of the event loop, about ``FRAMES_PER_TURN``
  frames' worth and at most ``PARSE_SLICE`` bytes, and none past the budget, so a read full of tiny frames
  neither holds the loop nor is parsed faster than it is served; a frame's payload, which costs the
  parser per byte and not per frame, goes whole, its end read from its header by `FrameBounds`);
  requests per connection and second (``max_requests_per_s``, a bad request counting
  ``BAD_REQUEST_COST``; past it a request is refused unread and the connection is not read again until
  the rate allows one more, so a flood costs the server at most twice that rate in messages, and a flood
  of bad requests a fifth of it; a connection over its rate with ``FLOOD_BACKLOG`` requests waiting is
  closed with 1008, and an address with ``FLOOD_BURST`` such closes gets HTTP 429 at the handshake, held
  as a failed key's, until ``FLOOD_RATE`` lets it in again);
  handshakes per second (``max_handshakes_per_s``, admitted ``HANDSHAKE_BURST_S`` of a second's worth at
  once; more wait their turn, up to ``MAX_HANDSHAKE_WAIT_S``, then HTTP 503); and a large message's bytes
  per connection and second (``max_receive_mb_per_s``; one connection at a time reads one, `ReceiveTurn`).
  Refusals are counted in ``oxygen_refusals_total{reason}`` and logged once per client and interval.

A request is held once, and no longer than it is served: websockets' parser keeps no payload of the frame
it parsed last, the raw message is dropped as soon as it is decoded, a backend with
``trim_request(request)`` (`TrimmingBackend`) has what it does not read dropped right after decoding, and a
served request is let go before the next one is read.

Each connection handles its requests in order, but connections are served concurrently, so requests from
different clients reach the backend at the same time and a batching backend can group them. A backend with
``async def infer_async(obs)`` is awaited on the event loop; otherwise ``infer`` runs on a pool of
``infer_workers`` threads (default 1, because a plain policy need not be thread-safe).

Draining (SIGTERM/SIGINT, or leaving `open_server`): the server stops accepting; each robot connection
answers the requests it received before the drain began (read, buffered, or partly arrived), refuses in
one line each request already there that came after, then closes with 1001, so a drain ends while robots
keep sending; whatever is open after ``drain_timeout_s`` is closed as it stands.
"""

import asyncio
import collections
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
from typing import Protocol

from websockets.asyncio.server import Request, Response, ServerConnection
from websockets.asyncio.server import serve as _ws_serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import DATA_OPCODES, CloseCode, Frame

from oxygen_jax.errors import InvalidRequest
from oxygen_jax.serving import message_memory, metrics, msgpack_numpy
from oxygen_jax.serving.flow_control import (
    AddressThrottle,
    LogThrottle,
    ReadBudget,
    ReceiveTurn,
    RefusalHold,
    TokenBucket,
)
from oxygen_jax.serving.frame_bounds import FrameBounds
from oxygen_jax.serving.request_decoding import BadRequestError, decode_request
from oxygen_jax.serving.tickets import AUTH_HEADER, TICKET_PARAM, header_carries_key
from oxygen_jax.serving.tickets import valid as valid_ticket

logger = logging.getLogger(__name__)


class PolicyBackend(Protocol):
    """What the server serves: metadata for new clients and one result per observation."""

    @property
    def metadata(self) -> dict: ...

    def infer(self, obs: dict) -> dict: ...


class TrimmingBackend(PolicyBackend, Protocol):
    """A backend that says what it reads of a request: the server trims each request as soon as it is
    decoded, so what the backend never reads (an extra 15 MB array) is not held while it is served."""

    def trim_request(self, request: dict) -> dict: ...


class AsyncPolicyBackend(PolicyBackend, Protocol):
    """A backend that awaits requests on the event loop, e.g. to batch those from several clients."""

    async def infer_async(self, obs: dict) -> dict: ...


class TextStreamBackend(PolicyBackend, Protocol):
    """A backend that pushes text events: `listener(message)` may be called from any thread; the call
    returns the function that unsubscribes."""

    def subscribe_text(self, listener: Callable[[dict], None]) -> Callable[[], None]: ...


TEXT_PATH = "/text"
ROBOT, TEXT = "robot", "text"
# Requests that arrive within this of the drain's start (sent before it, still in the sockets' buffers)
# count as received before it; and a draining server waits this long, after a connection's last byte,
# for the rest of a request it owes.
DRAIN_GRACE_S = 0.2
# What each frame received counts in the read budget beyond its payload (the frame's objects, and the
# work of parsing it), so that tiny frames cannot queue up in their thousands under a byte bound: at most
# 256 under the default 4 MiB.
FRAME_CHARGE = 16 * 1024
# Bytes of one read handed to websockets' parser per turn of the event loop: a read may hold 256 KiB of
# tiny frames, whose parsing at once would hold the loop (and the GIL) for ~0.1 s. A connection's slice
# starts at `MIN_PARSE_SLICE` and doubles up to `PARSE_SLICE` while its slices hold few frames; one that
# held more than `FRAMES_PER_TURN` shrinks the next to hold about that many (a frame costs the loop
# 3-8 us on a 2-core CPU, so a turn parses at most ~0.5 ms of them). The rest of a frame's payload goes
# whole instead (`FrameBounds`): 15 MB in slices took the server 28.5 ms of CPU, whole 13.5 ms.
PARSE_SLICE = 16 * 1024
MIN_PARSE_SLICE = 512
FRAMES_PER_TURN = 64
# A payload this large is read while its connection holds the server's `ReceiveTurn`. A socket read of
# asyncio's full size (its transports read at most this much) says more bytes may be at hand.
LARGE_PAYLOAD = 2**20
FULL_READ = 256 * 1024
# Under `max_receive_mb_per_s` a connection ahead of its rate pauses reading once it is this far ahead, so a
# 15 MB message pauses some fifteen times rather than at every read.
MIN_RECEIVE_PAUSE_S = 0.004
# What a bad request costs under `max_requests_per_s`, in requests: robots rarely send one, a flood of them
# is the cheapest attack, and each costs the event loop (and the runtime thread, through the GIL).
BAD_REQUEST_COST = 10
# Requests a connection may have waiting unread while it is over its rate: past this many it is closed
# (1008). A robot waits for each reply (it has at most one waiting), and a flood keeps sending whatever it
# is told; closing it stops the flood at its source, which a shared machine's other clients feel as CPU.
FLOOD_BACKLOG = 64
# How long a flood's close waits for the client's closing handshake: its reply sits behind the flood's
# unread frames, which are not read again.
FLOOD_CLOSE_S = 0.5
# Text events a subscriber may leave unread before it is closed.
MAX_UNSENT_EVENTS = 1024
# A bad request's line quotes at most this much of the problem.
MAX_ERROR_CHARS = 300
# A client's repeated faults (bad requests, refusals, failed API keys) are logged once per this interval.
LOG_INTERVAL_S = 10.0
# Failed API keys one address may try in a burst, then one a second; past that HTTP 429 without a check.
FAILED_KEY_BURST, FAILED_KEY_RATE = 10, 1.0
KEYS_THROTTLED = "Too many failed API keys from this address: retry later"
# Connections one address may have closed for flooding in a burst, then one per 10 s; past that its
# robot connections get HTTP 429 (a flood that reconnects would otherwise cost a handshake each time).
FLOOD_BURST, FLOOD_RATE = 3, 0.1
FLOODS_THROTTLED = "Too many connections closed for flooding from this address: retry later"
# A throttled address's HTTP 429 waits until it may try again, at most this long and this many at once: a
# client that retries at once then tries at the throttle's rate. Refused at once, a wrong-key guesser
# retried ~400 times a second on a 2-core CPU, and a served robot's worst reply reached 2.2-2.6x its median.
REFUSAL_HOLD_S, MAX_HELD_REFUSALS = 2.0, 64
# Longest a handshake waits for its turn under `max_handshakes_per_s` before it is refused (HTTP 503).
MAX_HANDSHAKE_WAIT_S = 5.0
# New connections admitted at once: this much of a second's rate (5 at 100 a second; at least 1). A
# handshake costs the event loop ~2 ms on a 2-core CPU, so a burst of a full second's 100 held it for
# 0.2 s: in paired runs 300 handshakes at once cost a served robot 2.4-2.5x its median, 1.9x spread out.
HANDSHAKE_BURST_S = 0.05
# After the drain's deadline, how long closing handshakes may take before connections are cut.
DRAIN_CLOSE_S = 1.0


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """What one server accepts; None switches a limit off."""

    # Three 1280x720 uint8 cameras take 8.3 MB and four 480x640 float32 ones 14.7 MB.
    max_message_mb: float | None = 16.0
    max_connections: int | None = 64  # robot connections
    max_text_subscribers: int | None = 64
    max_connections_per_ip: int | None = None
    idle_timeout_s: float | None = 300.0
    # From a message's first frame to its last (16 MiB at 10 Mbit/s take 13 s).
    receive_timeout_s: float | None = 30.0
    drain_timeout_s: float = 30.0
    api_key: str | None = dataclasses.field(default=None, repr=False)
    debug_errors: bool = False
    # Requests received and not yet taken by the handler: a robot waits for each reply, so it has none
    # (an observation with three 224x224 cameras is 0.5 MB); past these, reading pauses.
    max_pending_mb: float | None = 4.0  # per connection
    max_pending_total_mb: float | None = 256.0
    # Per connection, in bursts of as many: far above any robot's control rate. Past it: refused.
    max_requests_per_s: float | None = 500.0
    # New websocket connections in all, `HANDSHAKE_BURST_S` of them at once; past it a handshake waits
    # its turn.
    max_handshakes_per_s: float | None = 100.0
    # A large message's bytes (`LARGE_PAYLOAD` or more) per second on one connection, `LARGE_PAYLOAD` of
    # them at once: above a 1 Gbit/s link (119 MiB/s), so only a sender on the server's own host or a
    # faster network meets it, where it keeps one from taking the CPU the model's frames need.
    max_receive_mb_per_s: float | None = 200.0


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

    Leaving the block drains the server: it stops accepting, answers every request already received or
    buffered, then closes every connection (within `ServerLimits.drain_timeout_s`). Sets the process's
    malloc to reuse large messages' memory (`message_memory`).
    """
    message_memory.reuse_message_memory(_bytes(limits.max_message_mb))
    executor = ThreadPoolExecutor(infer_workers, thread_name_prefix="policy-infer")
    handler = _ConnectionHandler(backend, _backend_caller(backend, executor), limits)
    try:
        async with _ws_serve(
            handler,
            host,
            port,
            compression=None,
            max_size=_bytes(limits.max_message_mb),
            max_queue=None,  # pending requests are bounded in bytes (`ReadBudget`), not in frames
            process_request=handler.admit,
            server_header=None,
            create_connection=_Connection,
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


class _Connection(ServerConnection):
    """A server connection that counts the messages it received and its handler has not taken (their
    bytes in the server's `ReadBudget`, which pauses its reading past a bound), reads a large message one
    connection at a time (`ReceiveTurn`) and at most at its receive rate, and notes when bytes last
    arrived and when a frame last ended, so a drain can tell a connection in the middle of receiving a
    message from an idle one."""

    budget: ReadBudget | None = None  # set at admission
    turn: ReceiveTurn | None = None  # set at admission
    receive_rate: TokenBucket | None = None  # a large message's bytes; set at admission
    last_data = 0.0
    last_frame = 0.0
    pending_bytes = 0
    owed: int | None = None  # draining: requests still to answer (those received before the drain)

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.unread_sizes: collections.deque[int] = collections.deque()  # whole messages, oldest first
        self._partial = 0  # bytes of the fragments of the message being received
        self._unparsed = bytearray()  # the rest of a read, parsed a slice at a time
        self._slice = MIN_PARSE_SLICE  # bytes parsed per turn, from the frames per byte seen so far
        self._bounds = FrameBounds()  # a payload under way is handed to the parser whole
        self._frames_parsed = 0
        self._budget_paused = False
        self._turn_paused = False
        self._rate_paused = False

    def data_received(self, data: bytes) -> None:
        self.last_data = time.monotonic()
        if not self._unparsed and len(data) <= self._bounds.payload_left:
            self._parse(data)  # all of it payload of the frame under way: no frame ends in it
        else:
            self._unparsed += data
            if len(self._unparsed) == len(data):  # no slice scheduled yet
                self._parse_slice()
        self._take_turn(at_hand=len(data) >= getattr(self.transport, "max_size", FULL_READ))
        if self._bounds.payload_left >= LARGE_PAYLOAD:
            self._keep_rate(len(data))

    def _keep_rate(self, received: int) -> None:
        """Charges a large message's bytes to `receive_rate`; once `MIN_RECEIVE_PAUSE_S` ahead of it, reading
        pauses until the rate catches up (the kernel's buffers fill and TCP slows the sender)."""
        if self.receive_rate is None:
            return
        self.receive_rate.spend(received)
        ahead_s = self.receive_rate.wait_s()
        if ahead_s >= MIN_RECEIVE_PAUSE_S and not self._rate_paused:
            self._rate_paused = True
            self._apply_pause()
            self.loop.call_later(ahead_s, self._rate_caught_up)

    def _rate_caught_up(self) -> None:
        self._rate_paused = False
        self._apply_pause()

    def _parse_slice(self) -> None:
        """Parses the next slice of the read; while any is left, reading pauses and the rest waits for the
        loop's next turn, so other connections are served in between. Past the read budget the rest also
        waits until the handler has taken enough (`resume_reading`): a read of tiny frames is parsed only
        as fast as its requests are served, not all at once into a queue the connection could never
        clear."""
        if self.transport.is_closing():
            self._unparsed.clear()
            return
        payload = self._bounds.payload_left  # the rest of a frame's payload goes whole, then a slice
        size = payload or self._slice
        piece = bytes(self._unparsed[:size])
        del self._unparsed[:size]
        self._parse(piece)
        if not payload:
            self._slice = _next_slice(self._slice, len(piece), self._frames_parsed)
        if self._unparsed and not self._budget_paused:
            self.loop.call_soon(self._parse_slice)
        self._take_turn(at_hand=True)

    def _take_turn(self, *, at_hand: bool) -> None:
        """In the middle of a large payload, reads only while it holds the server's `ReceiveTurn`; passes
        it on when the payload is whole, no more bytes may be `at_hand` or its read budget holds it."""
        if self.turn is not None:
            large = self._bounds.payload_left >= LARGE_PAYLOAD
            reading = at_hand and not self._budget_paused
            if self.turn.holder is self and not (large and reading):
                self._turn_paused = not self.turn.pass_on(self, done=not large)
            elif large and not self._budget_paused:
                self._turn_paused = not self.turn.take(self)
        self._apply_pause()

    def turn_granted(self) -> None:
        self._turn_paused = False
        self._apply_pause()

    def _parse(self, data: bytes) -> None:
        self._bounds.advance(data)
        self._frames_parsed = 0
        super().data_received(data)

    def process_event(self, event: object) -> None:
        if isinstance(event, Frame) and event.opcode in DATA_OPCODES:
            # websockets' parser keeps the frame it parsed last until the next one is whole: it keeps the
            # frame's header, while the handler gets a frame of its own with the payload.
            payload, event.data = event.data, b""
            event = dataclasses.replace(event, data=payload)
        super().process_event(event)
        if not isinstance(event, Frame):
            return
        self._frames_parsed += 1
        self.last_frame = self.last_data
        if event.opcode in DATA_OPCODES:
            charge = len(event.data) + FRAME_CHARGE
            self._partial += charge
            if self.budget is not None:
                self.budget.received(self, charge)
            if event.fin:
                self.unread_sizes.append(self._partial)
                self._partial = 0

    @property
    def receiving(self) -> bool:
        """Whether part of a message has arrived (fragments, bytes after the last whole frame, or a read
        not parsed yet)."""
        return self._partial > 0 or self.last_data > self.last_frame or bool(self._unparsed)

    def took_message(self) -> int:
        """The handler took the oldest whole message: its size, which counts as pending until `answered`."""
        return self.unread_sizes.popleft() if self.unread_sizes else 0  # none once the budget let go

    def answered(self, size: int) -> None:
        """A request of `size` bytes was answered (or refused, or dropped): it no longer counts."""
        if self.budget is not None:
            self.budget.released(self, size)

    def leave_flow_control(self) -> None:
        """The connection is gone: what it left pending (a handler may still take it) no longer counts,
        and it waits for no turn and no rate."""
        self.receive_rate = None
        self._rate_paused = False
        if self.budget is not None:
            self.budget.forget(self)
            self.budget = None
            self.unread_sizes.clear()
        if self.turn is not None:
            self.turn.forget(self)
            self.turn = None
            self._turn_paused = False

    def read_until_closed(self) -> None:
        """The server is closing it: from now on what it sends is read, uncounted, so that its closing
        handshake gets through however much it had pending (else the close would wait out its timeout)."""
        self.leave_flow_control()
        self.resume_reading()

    def pause_reading(self) -> None:
        self._budget_paused = True
        self._apply_pause()

    def resume_reading(self) -> None:
        was_paused, self._budget_paused = self._budget_paused, False
        if was_paused and self._unparsed:  # the rest of its read waited for this (no slice is scheduled)
            self.loop.call_soon(self._parse_slice)
        self._apply_pause()

    def _apply_pause(self) -> None:
        """Reads while neither the budget nor a read still being parsed holds it back."""
        if self.transport.is_closing():
            return
        if self._budget_paused or self._turn_paused or self._rate_paused or self._unparsed:
            self.transport.pause_reading()
        else:
            self.transport.resume_reading()


class _ConnectionHandler:
    """Admits connections to their slots and runs each: a robot's requests in order, or a `/text` stream."""

    def __init__(
        self, backend: PolicyBackend, infer: Callable[[dict], Awaitable[dict]], limits: ServerLimits
    ) -> None:
        self._backend = backend
        self._infer = infer
        self._trim: Callable[[dict], dict] | None = getattr(backend, "trim_request", None)
        self._limits = limits
        self._slots: dict[ServerConnection, str] = {}  # connection -> ROBOT or TEXT, from admission on
        self._per_ip: collections.Counter[str] = collections.Counter()
        self._releases: set[asyncio.Task] = set()
        self._draining = asyncio.Event()
        self._budget = ReadBudget(_bytes(limits.max_pending_mb), _bytes(limits.max_pending_total_mb))
        self._receive_turn = ReceiveTurn()
        rate = limits.max_handshakes_per_s
        self._handshakes = None if rate is None else TokenBucket(rate, max(1.0, rate * HANDSHAKE_BURST_S))
        self._failed_keys = AddressThrottle(FAILED_KEY_RATE, FAILED_KEY_BURST)
        self._floods = AddressThrottle(FLOOD_RATE, FLOOD_BURST)
        self._holds = RefusalHold(MAX_HELD_REFUSALS, REFUSAL_HOLD_S)
        self._log = LogThrottle(logger, LOG_INTERVAL_S)
        served_metrics = metrics.of(backend)
        if served_metrics is not None:
            served_metrics.watch(lambda: {"oxygen_pending_request_bytes": self._budget.pending})

    async def drain(self) -> None:
        """Stops taking requests: each robot connection answers the requests it received before now
        (its `owed`), refuses those after and closes with 1001; `/text` streams close at once. Whatever is
        still open after `drain_timeout_s` gets `DRAIN_CLOSE_S` to close, then is cut."""
        await asyncio.sleep(DRAIN_GRACE_S)  # requests on their way at the signal are read meanwhile
        for connection, kind in self._slots.items():
            if kind == ROBOT and isinstance(connection, _Connection):
                connection.owed = len(connection.unread_sizes) + connection.receiving
        self._draining.set()
        try:
            async with asyncio.timeout(self._limits.drain_timeout_s):
                while self._slots:
                    await asyncio.sleep(0.01)
        except TimeoutError:
            logger.warning("Drain timed out: closing %d connections as they stand", len(self._slots))
            closing = [
                websocket.close(CloseCode.GOING_AWAY, "server shutting down") for websocket in self._slots
            ]
            _, late = await asyncio.wait(
                [asyncio.ensure_future(close) for close in closing], timeout=DRAIN_CLOSE_S
            )
            for task in late:
                task.cancel()
            for websocket in list(self._slots):
                websocket.transport.abort()  # a client that does not answer the closing handshake

    async def admit(self, connection: ServerConnection, request: Request) -> Response | None:
        """The handshake hook: health and readiness, an address closed for flooding too often (HTTP 429),
        the API key (failed ones throttled per address), then a slot of the connection's kind (robot or
        `/text`) within its cap and the per-address cap, at most `max_handshakes_per_s` (a handshake waits
        its turn); refusals are one-line HTTP answers."""
        path = urllib.parse.urlsplit(request.path).path
        if path == "/healthz":
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        if path == "/readyz":
            return self._readiness(connection)
        if self._floods.throttled(_address(connection)):
            return await self._throttled(connection, self._floods, "flood_throttled", FLOODS_THROTTLED)
        key_refusal = await self._key_refusal(connection, request)
        if key_refusal is not None:
            return key_refusal
        if path == "/metrics":
            return metrics.respond(connection, self._backend)
        kind = TEXT if path == TEXT_PATH else ROBOT
        if kind == TEXT and not hasattr(self._backend, "subscribe_text"):
            return connection.respond(http.HTTPStatus.NOT_FOUND, "This server streams no text\n")
        refusal = await self._turn(connection)
        if refusal is None:
            refusal = self._refusal(connection, kind)
        if refusal is not None:
            self._refused(connection, "connection", refusal, logging.WARNING)
            return connection.respond(http.HTTPStatus.SERVICE_UNAVAILABLE, refusal + "\n")
        self._take_slot(connection, kind)
        return None

    async def _key_refusal(self, connection: ServerConnection, request: Request) -> Response | None:
        """HTTP 401 without the API key, 429 once an address failed too often (then its keys are not even
        compared until its bucket refills); None when it may go on."""
        if self._limits.api_key is None:
            return None
        address = _address(connection)
        if self._failed_keys.throttled(address):
            return await self._throttled(connection, self._failed_keys, "api_key_throttled", KEYS_THROTTLED)
        if self._authorized(request):
            return None
        self._failed_keys.offended(address)
        self._refused(connection, "api_key", "no valid API key")
        return connection.respond(http.HTTPStatus.UNAUTHORIZED, f"Unauthorized: send {AUTH_HEADER}\n")

    async def _throttled(
        self, connection: ServerConnection, throttle: AddressThrottle, reason: str, detail: str
    ) -> Response:
        """HTTP 429 for an address `throttle` holds back, counted and logged, sent when the address may
        try again (`RefusalHold`; a drain sends it at once) with ``Retry-After``."""
        self._refused(connection, reason, detail)
        address = _address(connection)
        await self._holds.hold(throttle.wait_s(address), self._draining)
        response = connection.respond(http.HTTPStatus.TOO_MANY_REQUESTS, detail + "\n")
        response.headers["Retry-After"] = throttle.retry_after(address)
        return response

    async def _turn(self, connection: ServerConnection) -> str | None:
        """Waits for this handshake's turn under `max_handshakes_per_s`; the refusal when it would wait
        longer than `MAX_HANDSHAKE_WAIT_S`."""
        if self._handshakes is None:
            return None
        wait = self._handshakes.reserve(MAX_HANDSHAKE_WAIT_S)
        if wait is None:
            return f"Too many new connections (at most {self._handshakes.rate:g} a second): retry later"
        if wait > 0:
            await asyncio.sleep(wait)
        return None

    def _refused(
        self, connection: ServerConnection, reason: str, detail: str, level: int = logging.INFO
    ) -> None:
        """Counts a refusal in the metrics and logs it once per address, reason and interval."""
        metrics.refused(self._backend, reason)
        address = _address(connection)
        what = f"refusals ({reason}) of {address}"
        self._log.log(level, (address, reason), what, "Refused %s: %s", connection.remote_address, detail)

    def _authorized(self, request: Request) -> bool:
        """Whether the request carries the server's API key as openpi-client sends it, or one valid ticket
        in its query (always, without a key); compared in constant time."""
        key = self._limits.api_key
        if key is None or header_carries_key(request.headers.get_all("Authorization"), key):
            return True
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(request.path).query)
        tickets = query.get(TICKET_PARAM, [])
        return len(tickets) == 1 and valid_ticket(tickets[0], key)

    def _readiness(self, connection: ServerConnection) -> Response:
        """200 "ready" when the backend is ready, the server is not draining and a robot can connect;
        else 503 with the reason."""
        robots = self._count(ROBOT)
        cap = self._limits.max_connections
        if self._draining.is_set():
            reason = "draining"
        elif not getattr(self._backend, "ready", True):
            reason = "backend not ready"
        elif cap is not None and robots >= cap:
            reason = f"robot slots full ({robots} of {cap})"
        else:
            return connection.respond(http.HTTPStatus.OK, "ready\n")
        return connection.respond(http.HTTPStatus.SERVICE_UNAVAILABLE, f"not ready: {reason}\n")

    def _refusal(self, connection: ServerConnection, kind: str) -> str | None:
        """Why this connection gets no slot, or None."""
        if self._draining.is_set():
            return "Server shutting down"
        cap = self._limits.max_connections if kind == ROBOT else self._limits.max_text_subscribers
        if cap is not None and self._count(kind) >= cap:
            what = "connections" if kind == ROBOT else "text subscribers"
            return f"Too many {what} (at most {cap})"
        per_ip = self._limits.max_connections_per_ip
        if per_ip is not None and self._per_ip[_address(connection)] >= per_ip:
            return f"Too many connections from one address (at most {per_ip})"
        return None

    def _count(self, kind: str) -> int:
        return sum(1 for taken in self._slots.values() if taken == kind)

    def _take_slot(self, connection: ServerConnection, kind: str) -> None:
        """Holds the slot from admission until the TCP connection is gone, whether or not the handshake
        completes (so concurrent handshakes cannot overshoot a cap)."""
        self._slots[connection] = kind
        self._per_ip[_address(connection)] += 1
        if isinstance(connection, _Connection):
            connection.budget, connection.turn = self._budget, self._receive_turn
            rate = _bytes(self._limits.max_receive_mb_per_s)
            connection.receive_rate = None if rate is None else TokenBucket(rate, LARGE_PAYLOAD)
        release = asyncio.ensure_future(connection.wait_closed())
        self._releases.add(release)
        release.add_done_callback(lambda task: self._free_slot(connection, task))

    def _free_slot(self, connection: ServerConnection, release: asyncio.Task) -> None:
        self._releases.discard(release)
        del self._slots[connection]
        if isinstance(connection, _Connection):
            connection.leave_flow_control()
        address = _address(connection)
        self._per_ip[address] -= 1
        if not self._per_ip[address]:
            del self._per_ip[address]

    async def __call__(self, websocket: ServerConnection) -> None:
        logger.info("Connection from %s opened", websocket.remote_address)
        try:
            url = urllib.parse.urlsplit(websocket.request.path)
            if url.path == TEXT_PATH:
                await self._stream_text(websocket, urllib.parse.parse_qs(url.query).get("robot_id"))
            else:
                await self._serve_robot(websocket)
        except ConnectionClosed:
            pass
        finally:
            logger.info("Connection from %s closed", websocket.remote_address)

    async def _serve_robot(self, websocket: _Connection) -> None:
        """Metadata, then one reply per request, until the client leaves or idles; past
        `max_requests_per_s` a request is refused unread. Draining, it answers the requests received
        before the drain began, refuses those that came after, then closes."""
        await websocket.send(msgpack_numpy.packb(self._backend.metadata))
        rate = self._limits.max_requests_per_s
        bucket = None if rate is None else TokenBucket(rate, rate)
        prev_total_ms: float | None = None
        try:
            while True:
                if self._draining.is_set() and (websocket.owed or 0) <= 0:
                    await self._refuse_after_drain(websocket)
                    return
                message = await self._next_message(websocket)
                if message is None:
                    return
                size = websocket.took_message()
                if websocket.owed is not None:
                    websocket.owed -= 1
                try:
                    if bucket is not None and not bucket.take():
                        detail = f"Too many requests: at most {rate:g} a second on one connection"
                        if len(websocket.unread_sizes) >= FLOOD_BACKLOG:
                            await self._close_flood(websocket, detail)
                            return
                        self._refused(websocket, "rate_limit", detail)
                        await websocket.send(detail + " (request not served)")
                        await asyncio.sleep(bucket.wait_s())  # nothing more is read meanwhile
                        continue
                    request = _decoded(message, self._trim)
                    del message  # the raw bytes are not held while the request is served
                    prev_total_ms = await self._serve_request(websocket, request, prev_total_ms, bucket)
                    del request  # nor the request while the next one is read
                finally:
                    websocket.answered(size)
        finally:
            self._log.flush((websocket, "bad_request"))

    async def _close_flood(self, websocket: _Connection, detail: str) -> None:
        """Closes a connection that keeps sending past its rate (`FLOOD_BACKLOG` requests waiting)."""
        reason = f"{detail}, {FLOOD_BACKLOG} more waiting"
        self._refused(websocket, "flood", reason)
        self._floods.offended(_address(websocket))
        websocket.close_timeout = FLOOD_CLOSE_S
        await websocket.close(CloseCode.POLICY_VIOLATION, reason)

    async def _refuse_after_drain(self, websocket: _Connection) -> None:
        """Refuses in one line each request that is here but arrived after the drain began, then closes
        (requests arriving meanwhile meet the close)."""
        for _ in range(len(websocket.unread_sizes)):
            await websocket.recv()
            websocket.answered(websocket.took_message())
            self._refused(websocket, "draining", "request after the drain began")
            await websocket.send(
                "Server shutting down: request not served (it arrived after the drain began)"
            )
        websocket.read_until_closed()
        await websocket.close(CloseCode.GOING_AWAY, "server shutting down")

    async def _serve_request(
        self,
        websocket: _Connection,
        request: dict | BadRequestError,
        prev_total_ms: float | None,
        rate: TokenBucket | None = None,
    ) -> float | None:
        """Answers one decoded request (or refuses one that did not decode; a bad request costs the
        connection's `rate` `BAD_REQUEST_COST` requests); returns its receipt-to-reply time when it was
        answered with actions (else `prev_total_ms` as it was)."""
        received = time.monotonic()
        error_kind = None
        if isinstance(request, BadRequestError):  # not raised: its traceback would hold this frame
            reply, error_kind = self._error_line(websocket, request), _error_kind(request)
        else:
            try:
                reply = await self._answer(request, prev_total_ms)
            except Exception as error:
                reply, error_kind = self._error_line(websocket, error), _error_kind(error)
        if error_kind == "bad_request" and rate is not None:
            rate.spend(BAD_REQUEST_COST - 1)
        await websocket.send(reply)
        metrics.record(self._backend, time.monotonic() - received, error_kind)
        if isinstance(reply, bytes):
            return (time.monotonic() - received) * 1000
        return prev_total_ms

    async def _next_message(self, websocket: _Connection) -> str | bytes | None:
        """The client's next whole message; None once the connection was closed for idling, for taking
        longer than `receive_timeout_s` from its first frame to its last, or for the drain (after every
        message already buffered was taken)."""
        fragments = websocket.recv_streaming()
        first = asyncio.ensure_future(anext(fragments))
        try:
            reason = await self._first_frame(websocket, first)
        finally:
            if not first.done():
                first.cancel()  # safe before the first frame (websockets' `recv_streaming`)
        if reason is not None:
            logger.info("Closing %s: %s", websocket.remote_address, reason)
            websocket.read_until_closed()
            await websocket.close(CloseCode.GOING_AWAY, reason)
            return None
        parts = [first.result()]
        try:
            async with asyncio.timeout(self._limits.receive_timeout_s):
                parts.extend([part async for part in fragments])
        except TimeoutError:
            reason = f"message not received whole within {self._limits.receive_timeout_s:g} s"
            logger.info("Closing %s: %s", websocket.remote_address, reason)
            websocket.read_until_closed()
            await websocket.close(CloseCode.POLICY_VIOLATION, reason)
            return None
        if len(parts) == 1:
            return parts[0]
        return "".join(parts) if isinstance(parts[0], str) else b"".join(parts)

    async def _first_frame(self, websocket: _Connection, first: asyncio.Future) -> str | None:
        """Waits for `first`; the reason to close instead (idle, or drained with nothing owed)."""
        if not self._draining.is_set():
            draining = asyncio.ensure_future(self._draining.wait())
            try:
                await asyncio.wait(
                    {first, draining},
                    timeout=self._limits.idle_timeout_s,
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                draining.cancel()
            if first.done():
                return None
            if not self._draining.is_set():
                return f"idle for {self._limits.idle_timeout_s:g} s"
        # Draining: take a request received before the drain, whole or still arriving.
        idle_since = time.monotonic()
        while not first.done():
            if (websocket.owed or 0) <= 0 and not websocket.unread_sizes:
                return "server shutting down"
            last = max(idle_since, getattr(websocket, "last_data", 0.0))
            grace = last + DRAIN_GRACE_S - time.monotonic()
            if grace <= 0:
                return "server shutting down"
            await asyncio.wait({first}, timeout=grace)
        return None

    async def _stream_text(self, websocket: ServerConnection, robot_ids: list[str] | None) -> None:
        """Sends each text event (of the robots in `robot_ids`, default all) until the client leaves, the
        server drains, it idles (no event and nothing from it for `idle_timeout_s`) or falls
        `MAX_UNSENT_EVENTS` behind."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[dict | None] = asyncio.Queue()

        def deliver(message: dict) -> None:
            if events.qsize() < MAX_UNSENT_EVENTS:
                events.put_nowait(message)
            elif events.qsize() == MAX_UNSENT_EVENTS:
                events.put_nowait(None)  # it stopped reading: close it once it gets here

        def listener(message: dict) -> None:
            if robot_ids is None or message.get("robot_id") in robot_ids:
                loop.call_soon_threadsafe(deliver, message)

        unsubscribe = self._backend.subscribe_text(listener)
        incoming = asyncio.ensure_future(websocket.recv())  # what it sends only proves it is there
        stopping = asyncio.ensure_future(self._draining.wait())
        event: asyncio.Future = asyncio.ensure_future(events.get())
        try:
            while True:
                await asyncio.wait(
                    {event, incoming, stopping},
                    timeout=self._limits.idle_timeout_s,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if stopping.done():
                    await websocket.close(CloseCode.GOING_AWAY, "server shutting down")
                    return
                if incoming.done():
                    incoming.result()  # raises ConnectionClosed once the client left
                    websocket.answered(websocket.took_message())
                    incoming = asyncio.ensure_future(websocket.recv())
                elif event.done():
                    message = event.result()
                    if message is None:
                        await self._close_slow_reader(
                            websocket, f"more than {MAX_UNSENT_EVENTS} events unread"
                        )
                        return
                    try:
                        async with asyncio.timeout(self._limits.idle_timeout_s):
                            await websocket.send(msgpack_numpy.packb(message))
                    except TimeoutError:
                        reason = f"an event unsent for {self._limits.idle_timeout_s:g} s"
                        await self._close_slow_reader(websocket, reason)
                        return
                    event = asyncio.ensure_future(events.get())
                else:
                    await websocket.close(CloseCode.GOING_AWAY, f"idle for {self._limits.idle_timeout_s:g} s")
                    return
        finally:
            unsubscribe()
            for task in (incoming, stopping, event):
                task.cancel()

    async def _close_slow_reader(self, websocket: ServerConnection, reason: str) -> None:
        """Closes a `/text` subscriber that stopped reading: 1008 (policy violation), as the stream's terms
        say; 1011 (internal error) would tell it the server failed."""
        logger.info("Closing %s: not reading, %s", websocket.remote_address, reason)
        metrics.refused(self._backend, "slow_reader")
        await websocket.close(CloseCode.POLICY_VIOLATION, f"not reading: {reason}")

    def _error_line(self, websocket: ServerConnection, error: Exception) -> str:
        """One line for the client; the traceback goes to the log under the same error id. Bad requests
        are logged once per connection and `LOG_INTERVAL_S` (the rest are counted)."""
        error_id = uuid.uuid4().hex[:8]
        if isinstance(error, BadRequestError):
            detail = _shortened(str(error))
            what = f"bad requests from {websocket.remote_address}"
            args = (websocket.remote_address, error_id, detail)
            self._log.log(
                logging.INFO, (websocket, "bad_request"), what, "Bad request from %s [%s]: %s", *args
            )
            line = f"Bad request: {detail} (error id {error_id})"
        else:
            logger.error("Request from %s failed [%s]", websocket.remote_address, error_id, exc_info=error)
            line = f"Internal server error: {type(error).__name__} (error id {error_id})"
        if self._limits.debug_errors:
            line += "\n" + "".join(traceback.format_exception(error))
        return line

    async def _answer(self, obs: dict, prev_total_ms: float | None) -> bytes:
        start = time.monotonic()
        try:
            result = await self._infer(obs)
        except InvalidRequest as error:
            raise BadRequestError(str(error)) from error
        infer_ms = (time.monotonic() - start) * 1000
        if not isinstance(result, dict):
            raise TypeError(f"backend returned {type(result).__name__}, expected dict")
        server_timing = {"infer_ms": infer_ms}
        if prev_total_ms is not None:
            server_timing["prev_total_ms"] = prev_total_ms
        reply = {"policy_timing": {"infer_ms": infer_ms}, **result, "server_timing": server_timing}
        return msgpack_numpy.packb(reply)


def _decoded(message: str | bytes, trim: Callable[[dict], dict] | None) -> dict | BadRequestError:
    """The request a message holds (trimmed by `trim`, if there is one), or why it holds none."""
    try:
        request = decode_request(message)
    except BadRequestError as error:
        return error
    return request if trim is None else trim(request)


def _next_slice(current: int, parsed: int, frames: int) -> int:
    """A connection's next slice after it parsed `frames` frames in `parsed` bytes of a `current` slice:
    about `FRAMES_PER_TURN` frames' worth once a slice holds more, twice as much after a full slice that
    held few."""
    if frames > FRAMES_PER_TURN:
        return max(MIN_PARSE_SLICE, parsed * FRAMES_PER_TURN // frames)
    if frames <= FRAMES_PER_TURN // 2 and parsed == current:
        return min(PARSE_SLICE, 2 * current)
    return current


def _bytes(mb: float | None) -> int | None:
    return None if mb is None else int(mb * 2**20)


def _address(connection: ServerConnection) -> str:
    """The client's IP address (a reverse proxy's, behind one)."""
    remote = connection.remote_address
    return str(remote[0]) if remote else "?"


def _error_kind(error: Exception) -> str:
    """The client's fault ("bad_request") or the server's ("internal")."""
    return "bad_request" if isinstance(error, BadRequestError) else "internal"


def _shortened(text: str) -> str:
    """One line of at most `MAX_ERROR_CHARS` characters (an error may quote what the client sent)."""
    line = " ".join(text[: 4 * MAX_ERROR_CHARS].split())
    return line if len(line) <= MAX_ERROR_CHARS else line[: MAX_ERROR_CHARS - 3] + "..."
