"""The websocket transport against the real openpi client, on loopback, with toy numpy backends."""

import asyncio
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgpack
import numpy as np
import pytest
from conftest import OPENPI_CLIENT_WARNING, free_port, http_get, openpi_client, wait_until_healthy, websocket
from websockets.exceptions import ConnectionClosed, InvalidStatus

from oxygen_jax.errors import InvalidRequest
from oxygen_jax.serving import msgpack_numpy
from oxygen_jax.serving.websocket_server import BackgroundServer, ServerLimits

# openpi-client pins numpy<2, so CI installs it with `pip install --no-deps openpi-client`.
pytest.importorskip("openpi_client.websocket_client_policy")
openpi_msgpack = pytest.importorskip("openpi_client.msgpack_numpy")

pytestmark = [pytest.mark.timeout(60), OPENPI_CLIENT_WARNING]

N_CLIENTS = 4
N_REQUESTS = 50
METADATA = {"name": "doubler", "action_horizon": 1, "dims": [3, 8]}


class DoublingBackend:
    """Answers ``actions = state[None] * 2`` and echoes the observation, so every reply names its request."""

    @property
    def metadata(self) -> dict:
        return METADATA

    def infer(self, obs: dict) -> dict:
        if "state" not in obs:
            raise InvalidRequest("observation is missing 'state'")
        state = obs["state"]
        if state.ndim != 1:
            raise InvalidRequest(f"state must be 1-D, got shape {state.shape}")
        if "crash" in obs:
            raise RuntimeError("backend crashed")
        if "bug" in obs:
            raise ValueError("a bug in the backend, not the client's mistake")
        return {"actions": state[None] * 2, "echo": obs}


class BatchingBackend(DoublingBackend):
    """Groups concurrent requests into one batch, as a model-backed batching backend would."""

    def __init__(self, batch_size: int, max_wait_s: float) -> None:
        self.batch_sizes: list[int] = []
        self._batch_size = batch_size
        self._max_wait_s = max_wait_s
        self._pending: list[tuple[dict, asyncio.Future]] = []
        self._timer: asyncio.TimerHandle | None = None

    async def infer_async(self, obs: dict) -> dict:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((obs, future))
        if len(self._pending) == self._batch_size:
            self._flush()
        elif len(self._pending) == 1:
            self._timer = loop.call_later(self._max_wait_s, self._flush)
        return await future

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        batch, self._pending = self._pending, []
        self.batch_sizes.append(len(batch))
        actions = np.stack([obs["state"] for obs, _ in batch])[:, None] * 2
        for (obs, future), action in zip(batch, actions, strict=True):
            future.set_result({"actions": action, "echo": obs})


class SelfTimedBackend(DoublingBackend):
    def infer(self, obs: dict) -> dict:
        return {**super().infer(obs), "policy_timing": {"infer_ms": 1.5}}


@pytest.fixture
def server():
    with BackgroundServer(DoublingBackend()) as running:
        yield running


def assert_same(got: Any, want: Any) -> None:
    """Equal values with equal types, down to array dtypes and shapes."""
    assert type(got) is type(want), (got, want)
    if isinstance(want, np.ndarray):
        assert (got.dtype, got.shape) == (want.dtype, want.shape)
        np.testing.assert_array_equal(got, want)
    elif isinstance(want, dict):
        assert got.keys() == want.keys()
        for key in want:
            assert_same(got[key], want[key])
    elif isinstance(want, list):
        assert len(got) == len(want)
        for got_item, want_item in zip(got, want, strict=True):
            assert_same(got_item, want_item)
    else:
        assert got == want


def mixed_observation() -> dict:
    rng = np.random.default_rng(0)
    return {
        "state": np.array([0.5, -1.25, 3.0], np.float32),
        "image": {"base_0_rgb": rng.integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)},
        "mask": np.array([True, False]),
        "half": np.arange(4, dtype=np.float16) / 3,
        "ints": np.array([[1, -2]], np.int64),
        "big_endian": np.arange(3, dtype=">i4"),
        "transposed": np.arange(6, dtype=np.float64).reshape(2, 3).T,
        "empty": np.zeros((0, 3), np.float32),
        "zero_dim": np.array(7, np.int32),
        "np_scalar": np.int16(-3),
        "flag": np.bool_(True),
        "prompt": "pick up the cup",
        "raw": b"\x00\x01",
        "nested": [1, 2.5, None, "x"],
    }


def test_encoding_matches_openpi_client_byte_for_byte():
    obs = mixed_observation()
    ours = msgpack_numpy.packb(obs)
    assert ours == openpi_msgpack.packb(obs)
    assert_same(msgpack_numpy.unpackb(openpi_msgpack.packb(obs)), openpi_msgpack.unpackb(ours))


def test_unsafe_dtypes_are_refused_both_ways():
    with pytest.raises(ValueError, match="unsupported dtype"):
        msgpack_numpy.packb(np.array([object()]))
    crafted = msgpack.packb({b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "|O", b"shape": [1]})
    with pytest.raises(ValueError, match="unsupported dtype"):
        msgpack_numpy.unpackb(crafted)


def test_metadata_arrives_on_openpi_client(server):
    assert openpi_client(server.port).get_server_metadata() == METADATA


def test_results_round_trip_exactly_with_timing(server):
    client = openpi_client(server.port)
    obs = mixed_observation()
    first = client.infer(obs)
    assert_same(first["actions"], obs["state"][None] * 2)
    assert_same(first["echo"], msgpack_numpy.unpackb(msgpack_numpy.packb(obs)))
    assert set(first["server_timing"]) == {"infer_ms"}
    assert set(first["policy_timing"]) == {"infer_ms"}
    second = client.infer(obs)
    assert set(second["server_timing"]) == {"infer_ms", "prev_total_ms"}
    # prev_total_ms is the first request's whole turn on the server, its inference included.
    assert second["server_timing"]["prev_total_ms"] >= first["server_timing"]["infer_ms"] > 0
    assert second["server_timing"]["infer_ms"] > 0


def test_backend_policy_timing_is_kept():
    with BackgroundServer(SelfTimedBackend()) as running:
        reply = openpi_client(running.port).infer({"state": np.zeros(2, np.float32)})
    assert reply["policy_timing"] == {"infer_ms": 1.5}


def run_client(port: int, client_id: int) -> int:
    """Sends requests that each carry their own id and checks every reply belongs to its request."""
    client = openpi_client(port)
    for i in range(N_REQUESTS):
        state = np.array([client_id, i, client_id * 1000 + i / 7], np.float32)
        tag = f"client{client_id}-request{i}"
        reply = client.infer({"state": state, "tag": tag})
        assert reply["echo"]["tag"] == tag
        assert_same(reply["actions"], state[None] * 2)
    return N_REQUESTS


@pytest.mark.parametrize("kind", ["thread", "batching"])
def test_concurrent_clients_get_their_own_answers(kind):
    backend = DoublingBackend() if kind == "thread" else BatchingBackend(N_CLIENTS, max_wait_s=5.0)
    with BackgroundServer(backend) as running, ThreadPoolExecutor(N_CLIENTS) as pool:
        answered = list(pool.map(run_client, [running.port] * N_CLIENTS, range(N_CLIENTS)))
    assert answered == [N_REQUESTS] * N_CLIENTS
    if kind == "batching":
        assert sum(backend.batch_sizes) == N_CLIENTS * N_REQUESTS
        assert max(backend.batch_sizes) == N_CLIENTS


def test_sync_backend_is_called_concurrently_with_several_workers():
    class BarrierBackend(DoublingBackend):
        """Answers only once every client's request is inside ``infer`` at the same time."""

        def __init__(self) -> None:
            self.barrier = threading.Barrier(N_CLIENTS, timeout=10)

        def infer(self, obs: dict) -> dict:
            self.barrier.wait()
            return super().infer(obs)

    def one_request(port: int) -> np.ndarray:
        return openpi_client(port).infer({"state": np.ones(2, np.float32)})["actions"]

    backend = BarrierBackend()
    with BackgroundServer(backend, infer_workers=N_CLIENTS) as running, ThreadPoolExecutor(N_CLIENTS) as pool:
        replies = list(pool.map(one_request, [running.port] * N_CLIENTS))
    for actions in replies:
        assert_same(actions, np.full((1, 2), 2, np.float32))


def test_bad_requests_get_an_error_and_everyone_keeps_working(server):
    good = {"state": np.array([1.0, 2.0], np.float32)}
    with ThreadPoolExecutor(1) as pool:
        bystander = pool.submit(run_client, server.port, 7)
        client = openpi_client(server.port)
        with pytest.raises(RuntimeError, match=r"Bad request: observation is missing 'state'"):
            client.infer({"no_state": 1})
        with pytest.raises(RuntimeError, match=r"Bad request: state must be 1-D"):
            client.infer({"state": np.zeros((2, 2))})
        assert_same(client.infer(good)["actions"], good["state"][None] * 2)
        assert bystander.result() == N_REQUESTS
    assert_same(openpi_client(server.port).infer(good)["actions"], good["state"][None] * 2)


@pytest.mark.parametrize(
    ("message", "problem"),
    [
        (b"\xc1", "undecodable msgpack-numpy message"),
        ("not msgpack", "expected a binary msgpack frame"),
        (msgpack_numpy.packb([1, 2]), "observation must be a map, got list"),
        (
            msgpack.packb({"state": {b"__ndarray__": True, b"data": b"abc", b"dtype": "<f4", b"shape": [2]}}),
            "undecodable msgpack-numpy message",
        ),
    ],
)
def test_undecodable_messages_get_an_error_and_the_connection_survives(server, message, problem):
    with websocket(server.port) as ws:
        ws.recv()  # Metadata.
        ws.send(message)
        reply = ws.recv(timeout=10)
        assert isinstance(reply, str)
        assert reply.startswith("Bad request: ") and problem in reply
        ws.send(msgpack_numpy.packb({"state": np.arange(3, dtype=np.int8)}))
        result = msgpack_numpy.unpackb(ws.recv(timeout=10))
    assert_same(result["actions"], np.arange(3, dtype=np.int8)[None] * 2)


def test_internal_error_is_one_line_with_an_id_and_closes_nothing(server):
    client, other = openpi_client(server.port), openpi_client(server.port)
    one_line = r"\nInternal server error: RuntimeError \(error id [0-9a-f]{8}\)$"
    with pytest.raises(RuntimeError, match=one_line):
        client.infer({"state": np.zeros(2), "crash": True})
    assert_same(client.infer({"state": np.ones(2)})["actions"], np.full((1, 2), 2.0))
    assert_same(other.infer({"state": np.ones(2)})["actions"], np.full((1, 2), 2.0))


def test_a_value_error_that_is_no_invalid_request_is_a_server_fault_logged_with_its_traceback(server, caplog):
    """Only `InvalidRequest` is the client's fault: any other ValueError is answered as an internal error,
    and the log holds its traceback at ERROR under the id the client got."""
    internal = r"Internal server error: ValueError \(error id ([0-9a-f]{8})\)$"
    with (
        caplog.at_level(logging.ERROR, logger="oxygen_jax.serving.websocket_server"),
        pytest.raises(RuntimeError, match=internal) as error,
    ):
        openpi_client(server.port).infer({"state": np.zeros(2), "bug": True})
    error_id = re.search(r"error id ([0-9a-f]{8})", str(error.value)).group(1)
    (record,) = [r for r in caplog.records if error_id in r.getMessage()]
    assert record.levelno == logging.ERROR and "a bug in the backend" in str(record.exc_info[1])


def test_debug_errors_send_the_traceback():
    limits = ServerLimits(debug_errors=True)
    with (
        BackgroundServer(DoublingBackend(), limits=limits) as running,
        pytest.raises(RuntimeError, match=r"(?s)Internal server error.*Traceback.*backend crashed"),
    ):
        openpi_client(running.port).infer({"state": np.zeros(2), "crash": True})


def raw_exchange(port: int, message: bytes) -> str | bytes:
    with websocket(port, max_size=None) as ws:
        ws.recv()  # Metadata.
        ws.send(message)
        return ws.recv(timeout=10)


def test_a_message_over_the_size_limit_closes_that_connection_with_a_reason():
    limits = ServerLimits(max_message_mb=1)
    with BackgroundServer(DoublingBackend(), limits=limits) as running:
        huge = msgpack_numpy.packb({"state": np.zeros(2**18 + 1, np.float32)})  # just over 1 MiB
        with pytest.raises(ConnectionClosed) as closed:
            raw_exchange(running.port, huge)
        assert closed.value.rcvd.code == 1009
        assert_same(openpi_client(running.port).infer({"state": np.ones(2)})["actions"], np.full((1, 2), 2.0))


def test_connections_over_the_limit_are_refused_at_the_handshake():
    with BackgroundServer(DoublingBackend(), limits=ServerLimits(max_connections=2)) as running:
        first, second = openpi_client(running.port), openpi_client(running.port)
        with pytest.raises(InvalidStatus, match="503"):
            websocket(running.port)
        first._ws.close()
        deadline = time.monotonic() + 10
        while True:  # the slot frees once the server has seen the close
            try:
                third = openpi_client(running.port)
                break
            except InvalidStatus:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        for client in (second, third):
            assert_same(client.infer({"state": np.ones(2)})["actions"], np.full((1, 2), 2.0))


def test_an_idle_connection_is_closed():
    with BackgroundServer(DoublingBackend(), limits=ServerLimits(idle_timeout_s=0.3)) as running:
        with websocket(running.port) as ws:
            ws.recv()  # Metadata.
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
        assert closed.value.rcvd.code == 1001 and "idle" in closed.value.rcvd.reason


@pytest.mark.parametrize(
    ("levels", "problem"),
    [
        (9, "observation nested deeper than 8 levels"),
        (1000, "observation holds more than 256 maps and lists"),
    ],
)
def test_deep_nesting_is_refused_in_one_line(server, levels, problem):
    deep: dict = {"state": np.ones(2)}
    for _ in range(levels):
        deep = {"x": deep}
    reply = raw_exchange(server.port, msgpack_numpy.packb(deep))
    assert isinstance(reply, str) and reply.startswith(f"Bad request: {problem}")


def test_healthz_answers_over_plain_http(server):
    assert http_get(server.port, "/healthz") == (200, "OK\n")


def test_stop_closes_connections_and_the_port():
    running = BackgroundServer(DoublingBackend()).start()
    client = openpi_client(running.port)
    port = running.port
    running.stop()
    running.stop()  # Idempotent.
    with pytest.raises(ConnectionClosed):
        client.infer({"state": np.zeros(2)})
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)


def test_start_reports_a_port_in_use():
    with BackgroundServer(DoublingBackend()) as running, pytest.raises(OSError):
        BackgroundServer(DoublingBackend(), port=running.port).start()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_serve_drains_in_flight_requests_on_signal(sig):
    """The request a client has in flight when the signal arrives is answered; then the server exits."""
    port = free_port()
    script = textwrap.dedent(f"""
        import time
        import numpy as np
        from oxygen_jax.serving.websocket_server import serve

        class Backend:
            metadata = {{}}

            def infer(self, obs):
                time.sleep(float(obs.get("sleep_s", 0)))
                return {{"actions": np.asarray(obs["state"])[None] * 2}}

        serve(Backend(), host="127.0.0.1", port={port})
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_until_healthy(proc, port, 20, lambda: "server did not come up")
        busy, idle = openpi_client(port), openpi_client(port)
        with ThreadPoolExecutor(1) as pool:
            in_flight = pool.submit(busy.infer, {"state": np.ones(2), "sleep_s": 1.0})
            time.sleep(0.3)
            proc.send_signal(sig)
            assert_same(in_flight.result(timeout=10)["actions"], np.full((1, 2), 2.0))
        assert proc.wait(timeout=10) == 0
        for client in (busy, idle):
            with pytest.raises(ConnectionClosed):
                client.infer({"state": np.ones(2)})
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
