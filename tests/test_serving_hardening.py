"""No client can stall or lock out the others: bounded decoding, fair slots, deadlines, auth and a
lossless drain, each against a small numpy backend on loopback."""

import asyncio
import signal
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import numpy as np
import pytest
from conftest import OPENPI_CLIENT_WARNING, http_get, openpi_client, raw_observation, serve_script, websocket
from websockets.exceptions import ConnectionClosed, InvalidStatus

from oxygen_jax.policies.request_options import RequestOptions
from oxygen_jax.serving import msgpack_numpy, policy_backend, tickets
from oxygen_jax.serving.policy_backend import SessionServerBackend
from oxygen_jax.serving.request_decoding import MAX_CONTAINERS, BadRequestError, decode_request
from oxygen_jax.serving.request_schema import CheckedRequest
from oxygen_jax.serving.websocket_server import BackgroundServer, ServerLimits

# openpi-client pins numpy<2, so CI installs it with `pip install --no-deps openpi-client`.
pytest.importorskip("openpi_client.websocket_client_policy")

pytestmark = [pytest.mark.timeout(60), OPENPI_CLIENT_WARNING]
STATE = np.arange(3, dtype=np.float32)


class StreamingBackend:
    """Answers `actions = state * 3` (after `sleep_s`, on the infer thread) and lets a test push text
    events to `/text` subscribers; `ready` is what `/readyz` reads."""

    def __init__(self) -> None:
        self.metadata = {"name": "tripler"}
        self.ready = True
        self._listeners: list[Callable[[dict], None]] = []
        self._subscribed = threading.Condition()

    def infer(self, obs: dict) -> dict:
        time.sleep(float(obs.get("sleep_s", 0.0)))
        return {"actions": np.asarray(obs["state"]) * 3}

    def subscribe_text(self, listener: Callable[[dict], None]) -> Callable[[], None]:
        with self._subscribed:
            self._listeners.append(listener)
            self._subscribed.notify_all()
        return lambda: self._listeners.remove(listener)

    def wait_for_subscriber(self) -> None:
        """The server subscribes a `/text` client after its handshake, so an event published as soon as
        the client connects could precede the subscription and never reach it."""
        with self._subscribed:
            assert self._subscribed.wait_for(lambda: self._listeners, timeout=10)

    def publish(self, text: str) -> None:
        for listener in list(self._listeners):
            listener({"robot_id": "r", "text": text})


def served(limits: ServerLimits | None = None, infer_workers: int = 4) -> BackgroundServer:
    limits = limits or ServerLimits()
    return BackgroundServer(StreamingBackend(), limits=limits, infer_workers=infer_workers)


def robot(port: int) -> Any:
    """A raw robot connection past its metadata."""
    connection = websocket(port, max_size=None)
    connection.recv()
    return connection


def ask(connection: Any, obs: dict) -> Any:
    connection.send(msgpack_numpy.packb(obs))
    reply = connection.recv(timeout=10)
    return msgpack_numpy.unpackb(reply) if isinstance(reply, bytes) else reply


def closed_with(connection: Any) -> tuple[int, str]:
    with pytest.raises(ConnectionClosed) as closed:
        connection.recv(timeout=10)
    return closed.value.rcvd.code, closed.value.rcvd.reason


@pytest.fixture
def server() -> Iterator[BackgroundServer]:
    with served() as running:
        yield running


# --- 1. bounded work before validation ---


def test_a_long_list_is_refused_at_its_header_without_building_it():
    """An extra key holding a list of 1 M ints (15 M in the attack) used to be walked element by element
    on the event loop and then served; now msgpack refuses its header."""
    message = msgpack.packb({"state": msgpack_numpy.packb(STATE), "junk": [1] * 1_000_000})
    with pytest.raises(BadRequestError, match="1000000 exceeds max_array_len"):
        decode_request(message)


def test_many_small_containers_are_refused_once_past_the_cap():
    junk = [[{"i": i} for i in range(100)] for _ in range(10)]  # 1010 containers of 100 items or fewer
    message = msgpack_numpy.packb({"state": STATE, "junk": junk})
    with pytest.raises(BadRequestError, match=f"more than {MAX_CONTAINERS} maps and lists"):
        decode_request(message)
    obs = decode_request(msgpack_numpy.packb({"state": STATE, "images": {"a": STATE, "b": STATE}}))
    np.testing.assert_array_equal(obs["images"]["b"], STATE)


def test_a_huge_list_gets_a_one_line_refusal_and_the_connection_serves_on(server):
    with robot(server.port) as connection:
        refused = ask(connection, {"state": STATE, "junk": list(range(300_000))})
        assert isinstance(refused, str) and refused.startswith("Bad request: undecodable")
        assert "max_array_len" in refused and "\n" not in refused
        np.testing.assert_array_equal(ask(connection, {"state": STATE})["actions"], STATE * 3)


# --- 2. fair slots, deadlines and readiness ---


def test_text_subscribers_have_their_own_cap_and_never_take_a_robots_slot():
    limits = ServerLimits(max_connections=2, max_text_subscribers=2)
    with served(limits) as running, websocket(running.port, "/text"), websocket(running.port, "/text"):
        with pytest.raises(InvalidStatus, match="503"):
            websocket(running.port, "/text")
        first, second = robot(running.port), robot(running.port)
        with pytest.raises(InvalidStatus, match="503"):
            robot(running.port)
        for connection in (first, second):
            np.testing.assert_array_equal(ask(connection, {"state": STATE})["actions"], STATE * 3)
            connection.close()


def test_an_idle_subscriber_is_closed_but_one_that_is_sent_events_is_not():
    # The timeout is 10 event intervals long, so a loaded machine that delays one tick does not close
    # the subscriber that is sent events.
    with served(ServerLimits(idle_timeout_s=1.0)) as running:
        with websocket(running.port, "/text") as reading:
            running._backend.wait_for_subscriber()
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:  # three idle timeouts, an event every 0.1 s
                running._backend.publish("tick")
                assert msgpack_numpy.unpackb(reading.recv(timeout=5))["text"] == "tick"
                time.sleep(0.1)
            assert closed_with(reading) == (1001, "idle for 1 s")  # once the events stop
        with websocket(running.port, "/text") as silent:
            assert closed_with(silent) == (1001, "idle for 1 s")


def test_a_message_trickled_in_fragments_is_cut_off_at_the_receive_deadline():
    """A client sending one fragment every 0.1 s (its pings answered) used to hold its slot until the idle
    timeout; the whole message must now arrive within `receive_timeout_s` of its first frame."""
    data = msgpack_numpy.packb({"state": STATE})

    def trickle() -> Iterator[bytes]:
        for byte in range(len(data)):
            yield data[byte : byte + 1]
            time.sleep(0.1)

    with served(ServerLimits(receive_timeout_s=0.5)) as running, robot(running.port) as connection:
        start = time.monotonic()
        with pytest.raises(ConnectionClosed):
            connection.send(trickle())
        code, reason = connection.close_code, connection.close_reason
        assert (code, reason) == (1008, "message not received whole within 0.5 s")
        assert time.monotonic() - start < 5
        with robot(running.port) as fast:  # fragments that arrive in time make one message
            fast.send(iter([data[:5], data[5:]]))
            np.testing.assert_array_equal(msgpack_numpy.unpackb(fast.recv(timeout=10))["actions"], STATE * 3)


def test_connections_from_one_address_are_capped():
    with served(ServerLimits(max_connections_per_ip=2)) as running:
        with websocket(running.port, "/text"), robot(running.port):
            for path in ("/", "/text"):
                with pytest.raises(InvalidStatus, match="503"):
                    websocket(running.port, path)
        with robot(running.port):  # slots free once their connections are gone
            pass


def test_readyz_says_ready_only_with_a_ready_backend_and_a_free_robot_slot():
    with served(ServerLimits(max_connections=1)) as running:
        assert http_get(running.port, "/readyz") == (200, "ready\n")
        running._backend.ready = False
        assert http_get(running.port, "/readyz") == (503, "not ready: backend not ready\n")
        running._backend.ready = True
        with robot(running.port):
            assert http_get(running.port, "/readyz") == (503, "not ready: robot slots full (1 of 1)\n")
            assert http_get(running.port, "/healthz") == (200, "OK\n")


# --- 3. request preparation: one robot's cannot delay another's ---


class AnyRequest:
    """A request schema that takes every request as it is."""

    def check(self, request: dict) -> CheckedRequest:
        return CheckedRequest(request, RequestOptions(), None, None)


class BlockingPrepareSession:
    """A session whose preparation of the robot sending `slow` waits until another robot's request was
    answered (at most 10 s): behind one shared prepare thread it would wait in vain."""

    metadata: dict = {}  # noqa: RUF012 (read only)
    policy = None
    max_text_tasks = 0
    rtc = True

    def __init__(self) -> None:
        self.other_answered = threading.Event()
        self.slow_saw_other_answered: bool | None = None

    def submit(self, request: Any, answer: Callable[[dict], None]) -> None:
        if "slow" in request.obs:
            self.slow_saw_other_answered = self.other_answered.wait(timeout=10)
        answer({"actions": np.asarray(request.obs["state"])})
        if "slow" not in request.obs:
            self.other_answered.set()

    def end(self, client: Any) -> None:
        pass


def test_a_slow_preparation_does_not_hold_up_another_robots_request(monkeypatch):
    monkeypatch.setattr(policy_backend, "RequestSchema", lambda *args, **kwargs: AnyRequest())
    session = BlockingPrepareSession()
    backend = SessionServerBackend(session, metrics=False)

    async def both() -> None:
        slow = asyncio.create_task(backend.infer_async({"state": STATE, "slow": True}))
        await asyncio.sleep(0.1)  # the slow one holds a prepare thread
        await asyncio.gather(backend.infer_async({"state": STATE}), slow)

    try:
        asyncio.run(both())
    finally:
        backend._prepare.shutdown()
    assert session.slow_saw_other_answered is True


# --- 4. authentication ---


def test_an_api_key_is_needed_by_robots_and_text_but_not_by_health_checks():
    with served(ServerLimits(api_key="s3cret")) as running:
        for path in ("/", "/text"):
            with pytest.raises(InvalidStatus, match="401"):
                websocket(running.port, path)
            for wrong in ({"Authorization": "Api-Key wrong"}, [("Authorization", "Api-Key s3cret")] * 2):
                with pytest.raises(InvalidStatus, match="401"):
                    websocket(running.port, path, additional_headers=wrong)
        keyed = openpi_client(running.port, api_key="s3cret")
        np.testing.assert_array_equal(keyed.infer({"state": STATE})["actions"], STATE * 3)
        with websocket(running.port, "/text", additional_headers={"Authorization": "Api-Key s3cret"}):
            pass
        with urllib.request.urlopen(f"http://127.0.0.1:{running.port}/healthz", timeout=10) as healthz:
            assert healthz.status == 200
            server = str(healthz.headers.get("Server"))
        assert http_get(running.port, "/readyz")[0] == 200
        assert "websockets" not in server and "Python" not in server


def test_a_valid_ticket_in_the_query_stands_in_for_the_api_key_and_a_stale_or_forged_one_does_not():
    with served(ServerLimits(api_key="s3cret")) as running:
        for ticket in (tickets.mint("s3cret", time.time() - 60), tickets.mint("other"), "9999999999.00"):
            with pytest.raises(InvalidStatus, match="401"):
                websocket(running.port, f"/?ticket={ticket}")
        with websocket(running.port, f"/?ticket={tickets.mint('s3cret')}") as ticketed:
            ticketed.recv(timeout=10)  # the metadata
            np.testing.assert_array_equal(ask(ticketed, {"state": STATE})["actions"], STATE * 3)


# --- 5. lossless drain ---


def test_stopping_answers_requests_sent_but_not_yet_read_before_closing():
    """Four robots each send a slow request and, without waiting, a second one; the server stops while
    the first ones run. Every second request, buffered unread when the drain began, is answered."""
    running = served(ServerLimits(drain_timeout_s=20), infer_workers=4).start()
    connections = [robot(running.port) for _ in range(4)]
    for i, connection in enumerate(connections):
        connection.send(msgpack_numpy.packb({"state": STATE + i, "sleep_s": 0.5}))
        connection.send(msgpack_numpy.packb({"state": STATE - i}))
    time.sleep(0.2)
    stopper = threading.Thread(target=running.stop)
    stopper.start()
    for i, connection in enumerate(connections):
        first, second = (msgpack_numpy.unpackb(connection.recv(timeout=10)) for _ in range(2))
        np.testing.assert_array_equal(first["actions"], (STATE + i) * 3)
        np.testing.assert_array_equal(second["actions"], (STATE - i) * 3)
        assert closed_with(connection)[0] == 1001
    stopper.join(timeout=20)
    assert not stopper.is_alive()


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_sigterm_answers_every_robots_buffered_request(tmp_path):
    """serve.py on the tiny model: four robots each send a request and, without waiting, a second one,
    then the server gets SIGTERM. All eight are answered before each connection closes with 1001."""
    with serve_script(tmp_path, "--drain_timeout_s=60") as (process, port):
        connections = [robot(port) for _ in range(4)]
        for connection in connections:  # warm-up: the first request compiles
            connection.send(msgpack_numpy.packb(raw_observation()))
            assert isinstance(connection.recv(timeout=120), bytes)
        for connection in connections:
            connection.send(msgpack_numpy.packb(raw_observation()))
            connection.send(msgpack_numpy.packb(raw_observation() | {"prompt": "open the drawer"}))
        process.send_signal(signal.SIGTERM)
        answered = 0
        for connection in connections:
            replies = [connection.recv(timeout=60) for _ in range(2)]
            answered += sum(msgpack_numpy.unpackb(reply)["actions"].shape == (10, 7) for reply in replies)
            assert closed_with(connection) == (1001, "server shutting down")
        assert answered == 8
        assert process.wait(timeout=60) == 0
