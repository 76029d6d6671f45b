"""What a client can make the server hold or do is bounded: pending requests in bytes, requests and
handshakes per second, failed API keys per address, log lines per connection; and a drain ends while
robots keep sending. Each against a small numpy backend on loopback, with small limits."""

import asyncio
import gc
import logging
import signal
import threading
import time
import tracemalloc
from typing import Any

import numpy as np
import pytest
from conftest import OPENPI_CLIENT_WARNING, http_get, metric_samples, raw_observation, serve_script, websocket
from test_serving_hardening import STATE, StreamingBackend, ask, robot
from websockets.asyncio.connection import Connection as ServerConnection
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.frames import Frame, Opcode

from oxygen_jax.serving import msgpack_numpy, policy_backend, websocket_server
from oxygen_jax.serving.flow_control import AddressThrottle, ReadBudget, ReceiveTurn, RefusalHold
from oxygen_jax.serving.metrics import ServerMetrics
from oxygen_jax.serving.websocket_server import (
    FLOOD_BACKLOG,
    FRAME_CHARGE,
    FRAMES_PER_TURN,
    BackgroundServer,
    ServerLimits,
)

pytestmark = [pytest.mark.timeout(60), OPENPI_CLIENT_WARNING]
SERVER_LOGGER = "oxygen_jax.serving.websocket_server"


class MeteredBackend(StreamingBackend):
    """The tripler with Prometheus metrics, so a test can read the server's counters."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics = ServerMetrics(self.metadata)


def served(**limits: Any) -> BackgroundServer:
    return BackgroundServer(MeteredBackend(), limits=ServerLimits(**limits), infer_workers=4)


def metric(port: int, name: str, **labels: str) -> float:
    samples = [s for s in metric_samples(port) if s.name == name and labels.items() <= s.labels.items()]
    return sum(sample.value for sample in samples)


def log_lines(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(text in record.getMessage() for record in caplog.records if record.name == SERVER_LOGGER)


# --- pending requests, in bytes ---


def pipelined_peak(limits: dict[str, Any]) -> float:
    """A robot pipelines 30 requests of 0.25 MB without reading (a robot waits for each reply) while
    another robot is served; the server's peak of pending request bytes. Every request is answered once
    the first robot reads."""
    message = msgpack_numpy.packb({"state": STATE, "padding": np.zeros(2**18, np.uint8), "sleep_s": 0.02})
    with served(**limits) as running, robot(running.port) as hog, robot(running.port) as healthy:
        sender = threading.Thread(target=lambda: [hog.send(message) for _ in range(30)])
        sender.start()
        peak, deadline = 0.0, time.monotonic() + 0.6
        while time.monotonic() < deadline:
            peak = max(peak, metric(running.port, "oxygen_pending_request_bytes"))
            np.testing.assert_array_equal(ask(healthy, {"state": STATE})["actions"], STATE * 3)
        replies = [hog.recv(timeout=10) for _ in range(30)]
        sender.join(timeout=10)
        assert all(msgpack_numpy.unpackb(reply)["actions"].shape == (3,) for reply in replies)
    return peak


def test_each_frame_counts_its_objects_so_tiny_frames_are_bounded_too():
    """A request pending in the server counts its bytes plus `FRAME_CHARGE`: under a 4 MiB bound a flood of
    1-byte frames holds at most 4096 of them, not four million."""
    message = msgpack_numpy.packb({"state": STATE, "sleep_s": 0.5})
    with served() as running, robot(running.port) as connection:
        connection.send(message)
        deadline = time.monotonic() + 0.4
        pending = 0.0
        while not pending and time.monotonic() < deadline:
            pending = metric(running.port, "oxygen_pending_request_bytes")
        assert pending == len(message) + FRAME_CHARGE
        connection.recv(timeout=10)


def frames_per_parse(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records, for each piece of a read handed to websockets' parser, how many frames it parsed."""
    counts: list[int] = []
    parse, process = ServerConnection.data_received, ServerConnection.process_event

    def counted_parse(connection: Any, data: bytes) -> None:
        counts.append(0)
        parse(connection, data)

    def counted_event(connection: Any, event: Any) -> None:
        counts[-1] += isinstance(event, Frame)
        process(connection, event)

    monkeypatch.setattr(ServerConnection, "data_received", counted_parse)
    monkeypatch.setattr(ServerConnection, "process_event", counted_event)
    return counts


def tiny_frames(payloads: list[bytes]) -> bytes:
    return b"".join(Frame(Opcode.BINARY, p).serialize(mask=True, extensions=[]) for p in payloads)


def test_a_read_full_of_tiny_frames_is_parsed_a_few_frames_per_turn_and_every_request_answered(monkeypatch):
    """One write of 4000 small requests (~270 kB: a few socket reads) reaches websockets' parser about
    `FRAMES_PER_TURN` frames per turn of the event loop, so parsing one read never holds the loop for
    long; nothing is lost or reordered, and a robot beside it is served meanwhile."""
    counts = frames_per_parse(monkeypatch)
    frames = tiny_frames([msgpack_numpy.packb({"state": STATE + i}) for i in range(4000)])
    with served(max_requests_per_s=None) as running, robot(running.port) as hog, robot(running.port) as other:
        hog.socket.sendall(frames)
        np.testing.assert_array_equal(ask(other, {"state": STATE})["actions"], STATE * 3)
        for i in range(4000):
            np.testing.assert_array_equal(
                msgpack_numpy.unpackb(hog.recv(timeout=10))["actions"], (STATE + i) * 3
            )
    assert sum(counts) >= 4001
    assert max(counts) <= FRAMES_PER_TURN + 1  # a slice may end a frame the one before began


def test_a_large_payload_reaches_the_parser_a_socket_read_at_a_time_and_tiny_frames_after_it_a_slice(
    monkeypatch,
):
    """A 4 MB request then 500 small ones in one write: the payload goes to websockets' parser whole per
    socket read (a slice per read of it cost the loop twice the CPU: pausing and resuming reading around
    each), the frames after it still about `FRAMES_PER_TURN` at a time, and every request is answered."""
    sizes: list[int] = []
    counts = frames_per_parse(monkeypatch)
    parse = ServerConnection.data_received

    def sized(connection: Any, data: bytes) -> None:
        sizes.append(len(data))
        parse(connection, data)

    monkeypatch.setattr(ServerConnection, "data_received", sized)
    large = msgpack_numpy.packb({"state": STATE, "junk": np.zeros(4 * 10**6, np.uint8)})
    small = [msgpack_numpy.packb({"state": STATE + i}) for i in range(500)]
    with served(max_requests_per_s=None, max_pending_mb=8) as running, robot(running.port) as client:
        start = len(sizes)
        client.socket.sendall(tiny_frames([large, *small]))
        for i in range(-1, 500):
            reply = msgpack_numpy.unpackb(client.recv(timeout=10))
            np.testing.assert_array_equal(reply["actions"], (STATE + max(i, 0)) * 3)
    pieces = sizes[start:]
    assert max(pieces) > 4 * websocket_server.PARSE_SLICE  # the payload, a read at a time
    assert sum(size > websocket_server.PARSE_SLICE for size in pieces) < len(large) // (64 * 1024)
    assert max(counts[start:]) <= FRAMES_PER_TURN + 1


def test_pipelined_tiny_requests_are_parsed_only_as_fast_as_they_are_served(monkeypatch):
    """20,000 small requests (1 MB, more than one socket read) sent at once on a connection under its
    rate, each served in 10 ms: past the read budget (0.1 MB, ~95 of them) the rest of a read waits
    unparsed, so in 1 s the server has parsed about what it served plus the budget, not the thousands one
    socket read holds; a robot beside it is served throughout."""
    counts = frames_per_parse(monkeypatch)
    request = msgpack_numpy.packb({"state": STATE, "sleep_s": 0.01})
    with (
        served(max_requests_per_s=None, max_pending_mb=0.1) as running,
        robot(running.port) as hog,
        robot(running.port) as other,
    ):
        sender = threading.Thread(target=lambda: hog.socket.sendall(tiny_frames([request] * 20_000)))
        sender.daemon = True  # blocked on a full socket buffer until the server closes it
        sender.start()
        deadline, asked = time.monotonic() + 1.0, 0
        while time.monotonic() < deadline:
            np.testing.assert_array_equal(ask(other, {"state": STATE})["actions"], STATE * 3)
            asked += 1
        parsed = sum(counts) - asked  # the hog's frames
        pending = metric(running.port, "oxygen_pending_request_bytes")
    budget = int(0.1 * 2**20) // (len(request) + FRAME_CHARGE)
    # at most one of the hog's requests per 10 ms was served
    assert parsed <= 100 + budget + 2 * FRAMES_PER_TURN, parsed
    assert pending <= 0.1 * 2**20 + (FRAMES_PER_TURN + 1) * (len(request) + FRAME_CHARGE)


def test_a_connection_that_floods_past_its_rate_is_closed_and_a_robot_beside_it_served(caplog):
    """A client sends one-byte bad messages as fast as it can, at 100 requests a second: once
    `FLOOD_BACKLOG` of them wait unread past the rate, the connection is closed with 1008 and its reason,
    which stops the sender (whose CPU the server's other robots would otherwise share); counted and logged
    once, and a robot beside it is served."""
    caplog.set_level(logging.INFO, SERVER_LOGGER)
    with (
        served(max_requests_per_s=100) as running,
        robot(running.port) as flood,
        robot(running.port) as other,
    ):
        began, sent = time.monotonic(), 0
        with pytest.raises(ConnectionClosed) as closed:
            while time.monotonic() - began < 5:
                flood.send(b"\xc1")
                sent += 1
        assert time.monotonic() - began < 2, sent
        assert closed.value.rcvd.code == 1008
        reason = f"Too many requests: at most 100 a second on one connection, {FLOOD_BACKLOG} more waiting"
        assert closed.value.rcvd.reason == reason
        np.testing.assert_array_equal(ask(other, {"state": STATE})["actions"], STATE * 3)
        assert metric(running.port, "oxygen_refusals_total", reason="flood") == 1
    assert log_lines(caplog, "more waiting") == 1  # the close, once


def flood_until_closed(connection: Any) -> tuple[int, str]:
    with pytest.raises(ConnectionClosed) as closed:
        for _ in range(100_000):
            connection.send(b"\xc1")
    return closed.value.rcvd.code, closed.value.rcvd.reason


def test_an_address_that_keeps_flooding_is_refused_at_the_handshake(monkeypatch):
    """Past `FLOOD_BURST` connections closed for flooding, the address's next robot connection gets HTTP
    429 with its reason (a flood that reconnects costs a refusal, not a handshake and a flood); /healthz
    stays open to it."""
    monkeypatch.setattr(websocket_server, "FLOOD_BURST", 2)
    with served(max_requests_per_s=100) as running:
        for _ in range(2):
            with robot(running.port) as flood:
                assert flood_until_closed(flood)[0] == 1008
        began = time.monotonic()
        with pytest.raises(InvalidStatus) as refused:
            websocket(running.port)
        assert refused.value.response.status_code == 429
        assert refused.value.response.body == (websocket_server.FLOODS_THROTTLED + "\n").encode()
        # Held until the address may try again (one close per 10 s refills), at most REFUSAL_HOLD_S.
        assert time.monotonic() - began >= websocket_server.REFUSAL_HOLD_S * 0.9
        assert int(refused.value.response.headers["Retry-After"]) >= 1
        assert http_get(running.port, "/healthz")[0] == 200


def test_settle_heap_leaves_full_collections_only_what_came_after():
    """`oxygen-serve` and each fleet replica call it after warm-up: what is alive then (params, programs,
    caches) is frozen, so a full collection (~0.3 s with the GIL held over a warmed pi05_tiny server's
    heap) walks only the objects made since."""
    held = [[i] for i in range(10_000)]
    try:
        policy_backend.settle_heap()
        assert gc.get_freeze_count() >= len(held)
        assert len(gc.get_objects()) < len(held)
    finally:
        gc.unfreeze()


def test_pipelined_large_requests_are_held_back_in_bytes_and_all_answered():
    """Pending requests stay within the per-connection bound plus the one that crossed it and one read of
    the socket; TCP holds the rest back. Without the bound the server holds several times as much."""
    bounded = pipelined_peak({"max_pending_mb": 0.5, "max_pending_total_mb": 0.6})
    assert 0 < bounded <= 0.5 * 2**20 + 2 * 2**18 + 2**18
    assert pipelined_peak({"max_pending_mb": None, "max_pending_total_mb": None}) > 2 * bounded


def test_a_robot_that_waits_for_its_replies_is_never_held_back_by_the_total():
    """The total bound is far below one request: a robot with nothing pending still gets each in."""
    with served(max_pending_mb=0.01, max_pending_total_mb=0.01) as running, robot(running.port) as healthy:
        big = {"state": STATE, "padding": np.zeros(2**20, np.uint8)}
        for _ in range(3):
            np.testing.assert_array_equal(ask(healthy, big)["actions"], STATE * 3)
        assert metric(running.port, "oxygen_pending_request_bytes") == 0


def held_by_the_server(min_size: int) -> int:
    """Bytes in blocks of at least `min_size` that the server's code allocated and still holds."""
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(True, websocket_server.__file__, all_frames=True)]
    )
    return sum(trace.size for trace in snapshot.traces if trace.size >= min_size)


def test_an_answered_request_leaves_none_of_its_bytes_held_until_the_next():
    """Once a request is answered, nothing of it stays while the next one is read: websockets' parser
    kept its last frame, and the server the decoded request, until the next request was whole, so a
    connection pipelining 15 MB requests held three of them."""
    padding = np.zeros(2**21, np.uint8)
    tracemalloc.start(40)
    try:
        with served() as running, robot(running.port) as connection:
            np.testing.assert_array_equal(
                ask(connection, {"state": STATE, "padding": padding})["actions"], STATE * 3
            )
            deadline = time.monotonic() + 2.0
            while held_by_the_server(2**20) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert held_by_the_server(2**20) == 0
    finally:
        tracemalloc.stop()


class TrimmingBackend(StreamingBackend):
    """The tripler that reads only `state` and notes what it was handed."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[dict] = []

    def trim_request(self, request: dict) -> dict:
        return {key: value if key == "state" else None for key, value in request.items()}

    def infer(self, obs: dict) -> dict:
        self.seen.append(obs)
        return super().infer(obs)


def test_a_backend_that_trims_is_handed_only_what_it_reads():
    backend = TrimmingBackend()
    with BackgroundServer(backend) as running, robot(running.port) as connection:
        reply = ask(connection, {"state": STATE, "padding": np.zeros(2**20, np.uint8)})
    np.testing.assert_array_equal(reply["actions"], STATE * 3)
    assert [{**obs, "state": "sent"} for obs in backend.seen] == [{"state": "sent", "padding": None}]


# --- the drain ends while robots keep sending ---


def test_the_drain_answers_what_came_before_refuses_what_came_after_and_ends_while_robots_send():
    running = served(drain_timeout_s=20).start()
    connections = [robot(running.port) for _ in range(3)]
    replies: list[list[Any]] = [[] for _ in connections]

    def keep_sending(connection: Any) -> None:
        message = msgpack_numpy.packb({"state": STATE, "sleep_s": 0.01})
        try:
            while True:
                connection.send(message)
                time.sleep(0.002)
        except ConnectionClosed:
            pass

    def keep_reading(connection: Any, into: list[Any]) -> None:
        try:
            while True:
                into.append(connection.recv(timeout=20))
        except ConnectionClosed:
            into.append((connection.close_code, connection.close_reason))

    threads = [threading.Thread(target=keep_sending, args=(c,)) for c in connections]
    threads += [
        threading.Thread(target=keep_reading, args=(c, r)) for c, r in zip(connections, replies, strict=True)
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    start = time.monotonic()
    running.stop(timeout=20)
    assert time.monotonic() - start < 10  # the drain_timeout_s is 20: it ended on its own
    for thread in threads:
        thread.join(timeout=10)
        assert not thread.is_alive()
    for received in replies:
        assert received[-1] == (1001, "server shutting down")
        answered = [reply for reply in received[:-1] if isinstance(reply, bytes)]
        refused = [reply for reply in received[:-1] if isinstance(reply, str)]
        assert answered and all(
            line.startswith("Server shutting down: request not served") for line in refused
        )
        assert received[: len(answered)] == answered  # refusals only after every answer


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_serve_exits_on_sigterm_well_within_the_drain_timeout_while_robots_keep_sending(tmp_path):
    """serve.py on the tiny model: two robots send requests back to back without waiting for replies;
    after SIGTERM each connection closes with 1001 and the process exits long before --drain_timeout_s."""
    with serve_script(tmp_path, "--drain_timeout_s=60") as (process, port):
        robots = [robot(port) for _ in range(2)]
        message = msgpack_numpy.packb(raw_observation())
        for connection in robots:  # warm-up: the first request compiles
            connection.send(message)
            assert isinstance(connection.recv(timeout=120), bytes)
        closes: list[tuple[int | None, str | None]] = []

        def keep_sending(connection: Any) -> None:
            reader = threading.Thread(target=lambda: closes.append(drain_replies(connection)))
            reader.start()
            try:
                while True:
                    connection.send(message)
                    time.sleep(0.005)
            except ConnectionClosed:
                reader.join(timeout=30)

        senders = [threading.Thread(target=keep_sending, args=(connection,)) for connection in robots]
        for sender in senders:
            sender.start()
        time.sleep(1.0)
        start = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert time.monotonic() - start < 15  # --drain_timeout_s is 60
        for sender in senders:
            sender.join(timeout=30)
        assert closes == [(1001, "server shutting down")] * 2


def drain_replies(connection: Any) -> tuple[int | None, str | None]:
    """Reads replies until the connection closes; its close code and reason."""
    try:
        while True:
            connection.recv(timeout=60)
    except ConnectionClosed:
        return connection.close_code, connection.close_reason


# --- rates and log lines ---


def test_requests_past_the_rate_are_refused_slowed_counted_and_logged_once(caplog):
    """20 requests at once at 5 a second in bursts of 5: the burst is served; past it each refusal is
    followed by a pause in reading until a token is back, so the next one is served and the 20 replies
    take at least 7 token periods (0.2 s each): a flood costs the server at most twice the rate."""
    caplog.set_level(logging.INFO, SERVER_LOGGER)
    with served(max_requests_per_s=5) as running, robot(running.port) as connection:
        for _ in range(20):
            connection.send(msgpack_numpy.packb({"state": STATE}))
        began = time.monotonic()
        replies = [connection.recv(timeout=10) for _ in range(20)]
        took = time.monotonic() - began
        refused = [reply for reply in replies if isinstance(reply, str)]
        assert 5 <= len(refused) <= 9, len(refused)  # 15 past the burst: about every other one refused
        assert took >= 1.3, took
        assert all(isinstance(reply, bytes) for reply in replies[:5])
        assert set(refused) == {
            "Too many requests: at most 5 a second on one connection (request not served)"
        }
        assert metric(running.port, "oxygen_refusals_total", reason="rate_limit") == len(refused)
        time.sleep(1.0)  # refilled: served again
        np.testing.assert_array_equal(ask(connection, {"state": STATE})["actions"], STATE * 3)
    assert log_lines(caplog, "Too many requests") == 1


def test_a_bad_request_costs_several_under_the_rate():
    """At 50 requests a second in bursts of 50, five bad requests spend the burst (each costs
    `BAD_REQUEST_COST` = 10): the sixth message is refused for the rate, unread."""
    with served(max_requests_per_s=50) as running, robot(running.port) as connection:
        for _ in range(6):
            connection.send("not msgpack")
        replies = [connection.recv(timeout=10) for _ in range(6)]
    assert all(reply.startswith("Bad request") for reply in replies[:5])
    assert replies[5].startswith("Too many requests"), replies[5]


def test_repeated_bad_requests_are_counted_and_logged_once_per_connection(caplog):
    caplog.set_level(logging.INFO, SERVER_LOGGER)
    with served() as running:
        with robot(running.port) as connection:
            for _ in range(50):
                connection.send("not msgpack")
            replies = [connection.recv(timeout=10) for _ in range(50)]
            assert all(reply.startswith("Bad request: expected a binary msgpack frame") for reply in replies)
            assert metric(running.port, "oxygen_errors_total", kind="bad_request") == 50
        deadline = time.monotonic() + 5
        while log_lines(caplog, "49 more bad requests") == 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # the summary comes when the connection ends
    assert log_lines(caplog, "Bad request from") == 1
    assert log_lines(caplog, "... and 49 more bad requests") == 1


def test_failed_api_keys_are_throttled_per_address_counted_and_logged_once(caplog):
    caplog.set_level(logging.INFO, SERVER_LOGGER)
    wrong = {"Authorization": "Api-Key wrong"}
    with served(api_key="s3cret") as running:
        statuses, took = [], []
        for _ in range(12):
            began = time.monotonic()
            with pytest.raises(InvalidStatus) as refused:
                websocket(running.port, additional_headers=wrong)
            statuses.append(refused.value.response.status_code)
            took.append(time.monotonic() - began)
        # A burst of 10 checked keys, then 429 held until the address may try again (one a second), then
        # that one try: a guesser that retries at once gets one key checked a second.
        assert statuses == [401] * 10 + [429, 401]
        assert took[10] >= 0.8 and max(took[:10]) < 0.8
        registry = running._backend.metrics.registry  # /metrics needs a key, which waits its turn too
        assert registry.get_sample_value("oxygen_refusals_total", {"reason": "api_key"}) == 11
        assert registry.get_sample_value("oxygen_refusals_total", {"reason": "api_key_throttled"}) == 1
        time.sleep(1.1)  # one failure a second refills: the right key is checked again
        with websocket(running.port, additional_headers={"Authorization": "Api-Key s3cret"}):
            pass
    assert log_lines(caplog, "no valid API key") == 1
    assert log_lines(caplog, "Too many failed API keys") == 1


def test_handshakes_are_admitted_at_the_bounded_rate():
    """Ten robots connect at once at 5 handshakes a second, one at a time (a twentieth of the rate, at
    least 1): all get in, one every 0.2 s (at least 1.8 s for the ten)."""
    with served(max_handshakes_per_s=5) as running:
        opened: list[Any] = []
        start = time.monotonic()
        threads = [threading.Thread(target=lambda: opened.append(robot(running.port))) for _ in range(10)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=20)
        elapsed = time.monotonic() - start
        assert len(opened) == 10 and elapsed >= 1.7
        for connection in opened:
            np.testing.assert_array_equal(ask(connection, {"state": STATE})["actions"], STATE * 3)
            connection.close()


def test_a_text_subscriber_that_stops_reading_is_closed_with_1008():
    """The subscriber reads nothing (its client buffers one message): once an event waits unsent for the
    idle timeout, it is closed with 1008 (policy violation), not 1011 (an internal error)."""
    limits = {"idle_timeout_s": 0.5}
    with served(**limits) as running, websocket(running.port, "/text", max_queue=1, max_size=None) as stalled:
        running._backend.wait_for_subscriber()
        for _ in range(64):
            running._backend.publish("x" * 2**20)
        time.sleep(2)  # reads nothing meanwhile
        received = 0
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                stalled.recv(timeout=20)
                received += 1
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008, closed.value
        assert closed.value.rcvd.reason == "not reading: an event unsent for 0.5 s"
        assert received < 64
        assert metric(running.port, "oxygen_refusals_total", reason="slow_reader") == 1


class FakeReader:
    """A connection as `ReadBudget` sees it: its pending bytes and whether its reading is paused."""

    def __init__(self) -> None:
        self.pending_bytes = 0
        self.paused = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


def test_failed_keys_throttle_an_address_after_its_burst_until_it_refills():
    keys = AddressThrottle(rate=20.0, burst=3)
    for _ in range(3):
        assert not keys.throttled("a")
        keys.offended("a")
    assert keys.throttled("a") and not keys.throttled("b")  # one address's failures are its own
    assert keys.wait_s("a") == pytest.approx(0.05, abs=0.01) and keys.wait_s("b") == 0.0
    time.sleep(0.06)  # 20 a second: one failure refilled
    assert not keys.throttled("a") and keys.wait_s("a") == 0.0


def test_a_held_refusal_waits_until_the_address_may_try_again_at_most_so_long_and_so_many_at_once():
    async def held(hold: RefusalHold, wait_s: float, release: asyncio.Event | None = None) -> float:
        began = time.monotonic()
        await hold.hold(wait_s, release)
        return time.monotonic() - began

    async def scenario() -> None:
        hold = RefusalHold(max_held=2, max_hold_s=0.3)
        assert await held(hold, 0.1) == pytest.approx(0.1, abs=0.05)  # until the address may try again
        assert await held(hold, 0.0) < 0.01  # not throttled: nothing to wait for
        two = [asyncio.create_task(held(hold, 5.0)) for _ in range(2)]
        await asyncio.sleep(0)
        assert hold.held == 2 and await held(hold, 5.0) < 0.01  # a third goes out at once
        assert await asyncio.gather(*two) == [pytest.approx(0.3, abs=0.1)] * 2  # at most max_hold_s
        release = asyncio.Event()
        released = asyncio.create_task(held(hold, 5.0, release))
        await asyncio.sleep(0.05)
        release.set()  # a drain
        assert await released < 0.15 and hold.held == 0

    asyncio.run(scenario())


class FakeTaker:
    def __init__(self) -> None:
        self.granted = 0

    def turn_granted(self) -> None:
        self.granted += 1


def test_one_connection_at_a_time_reads_a_large_message_and_passes_the_turn_when_done_or_out_of_bytes():
    turn = ReceiveTurn()
    first, second, third = FakeTaker(), FakeTaker(), FakeTaker()
    assert turn.take(first) and turn.take(first)  # free, then its own
    assert not turn.take(second) and not turn.take(third) and not turn.take(second)  # in line, once each
    assert turn.pass_on(first, done=True) and turn.holder is second and second.granted == 1
    assert not turn.pass_on(second, done=False)  # out of bytes at hand, not done: to the back of the line
    assert turn.holder is third and third.granted == 1
    assert turn.pass_on(third, done=True) and turn.holder is second and second.granted == 2
    assert turn.pass_on(second, done=False) and turn.holder is second  # no one waits: it reads on
    assert turn.pass_on(first, done=True)  # not the holder: nothing changes
    assert turn.pass_on(second, done=True) and turn.holder is None


def test_a_connection_that_goes_leaves_the_line_and_hands_its_turn_on():
    turn = ReceiveTurn()
    first, second, third = FakeTaker(), FakeTaker(), FakeTaker()
    turn.take(first), turn.take(second), turn.take(third)
    turn.forget(second)  # gone while in line
    turn.forget(first)  # gone while holding
    assert turn.holder is third and third.granted == 1 and second.granted == 0
    turn.forget(third)
    assert turn.holder is None


def test_large_messages_sent_at_once_on_several_connections_are_all_answered_beside_a_robot(monkeypatch):
    """Three connections send a 4 MB request each at the same moment while a robot asks between them:
    they take turns reading (`ReceiveTurn`), every request is answered, and no reading stalls for good."""
    monkeypatch.setattr(websocket_server, "LARGE_PAYLOAD", 2**18)
    junk = np.zeros(4 * 10**6, np.uint8)
    large = [msgpack_numpy.packb({"state": STATE + i, "junk": junk}) for i in range(3)]
    with served(max_requests_per_s=None, max_pending_mb=8) as running, robot(running.port) as other:
        clients = [robot(running.port) for _ in large]
        try:
            pairs = zip(clients, large, strict=True)
            senders = [threading.Thread(target=client.send, args=(m,)) for client, m in pairs]
            for sender in senders:
                sender.start()
            np.testing.assert_array_equal(ask(other, {"state": STATE})["actions"], STATE * 3)
            for i, client in enumerate(clients):
                reply = msgpack_numpy.unpackb(client.recv(timeout=30))
                np.testing.assert_array_equal(reply["actions"], (STATE + i) * 3)
            for sender in senders:
                sender.join(timeout=30)
        finally:
            for client in clients:
                client.close()


def test_a_large_message_is_read_at_most_at_the_receive_rate_and_answered():
    """An 8 MiB request under `max_receive_mb_per_s=16`: its bytes are charged until less than a MiB is left
    (the read that leaves less is not: up to `FULL_READ`), the first MiB is the bucket's burst, so at
    least 6 MiB less a read wait for the rate (0.36 s, less one pause's threshold); with no rate the same
    request is answered in well under half that."""
    junk = np.zeros(8 * 2**20 - 64, np.uint8)
    message = msgpack_numpy.packb({"state": STATE, "junk": junk})
    elapsed = {}
    for rate in (16.0, None):
        limits = {"max_receive_mb_per_s": rate, "max_pending_mb": 16, "max_requests_per_s": None}
        with served(**limits) as running, robot(running.port) as client:
            start = time.monotonic()
            client.send(message)
            reply = msgpack_numpy.unpackb(client.recv(timeout=10))
            elapsed[rate] = time.monotonic() - start
            np.testing.assert_array_equal(reply["actions"], STATE * 3)
    charged_mib = 6 - websocket_server.FULL_READ / 2**20
    assert elapsed[16.0] >= charged_mib / 16 - websocket_server.MIN_RECEIVE_PAUSE_S, elapsed
    assert elapsed[None] < elapsed[16.0] / 2, elapsed


def test_the_read_budget_pauses_past_either_bound_and_never_a_connection_with_nothing_pending():
    budget = ReadBudget(per_connection=100, total=150)
    hog, other, idle = FakeReader(), FakeReader(), FakeReader()
    budget.received(hog, 101)
    assert hog.paused and budget.pending == 101  # past its own bound
    budget.received(other, 60)
    assert other.paused  # the total (161) is past 150 and it has pending bytes
    budget.released(hog, 101)
    assert not hog.paused and not other.paused and budget.pending == 60
    budget.received(idle, 0)
    budget.received(hog, 100)
    assert not idle.paused and hog.paused  # 160 > 150: only those with pending bytes wait
    budget.forget(hog)
    assert budget.pending == 60 and not other.paused
