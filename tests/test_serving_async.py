"""Robots served through the asynchronous device loop, with the `/text` push stream listening."""

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import (
    MAX_TEXT_TOKENS,
    OPENPI_CLIENT_WARNING,
    answers_alone,
    raw_observation,
    run_client,
    websocket,
)
from websockets.exceptions import ConnectionClosed, InvalidStatus

from oxygen_jax.engine.compile_counter import CompileCounter
from oxygen_jax.robots.robots import Robots
from oxygen_jax.runtime.runtime import RuntimeConfig
from oxygen_jax.serving import msgpack_numpy
from oxygen_jax.serving.policy_backend import PolicyServerBackend, SessionServerBackend
from oxygen_jax.serving.websocket_server import BackgroundServer

# openpi-client pins numpy<2, so CI installs it with `pip install --no-deps openpi-client`.
pytest.importorskip("openpi_client.websocket_client_policy")

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300), OPENPI_CLIENT_WARNING]

N_CLIENTS = 4
N_REQUESTS = 50
N_NOISES = 8


@pytest.fixture(scope="module")
def noises() -> np.ndarray:
    return np.random.default_rng(2).standard_normal((N_NOISES, 10, 32)).astype(np.float32)


class Subscriber(threading.Thread):
    """A `/text` websocket client that records every message until the server closes the stream."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.connection = websocket(port, "/text")
        self.messages: list[dict] = []

    def run(self) -> None:
        try:
            while True:
                self.messages.append(msgpack_numpy.unpackb(self.connection.recv()))
        except ConnectionClosed:
            pass


@pytest.fixture(scope="module")
def served(policy, noises):
    """Every client's replies (noise index, reply) from one concurrent run through the async loop, the
    `/text` stream's messages, compile counts, and `Policy.infer`'s answers to each observation alone."""
    actions, texts = answers_alone(policy, noises, N_CLIENTS)
    session = Robots(
        policy,
        RuntimeConfig(
            max_slots=N_CLIENTS,
            max_new_tokens=MAX_TEXT_TOKENS,
            loop="async",
            max_prefill_batch=4,
            gather_s=0.005,
        ),
    )
    session.warmup(raw_observation())

    with CompileCounter() as compiles:
        with BackgroundServer(SessionServerBackend(session)) as server:
            subscriber = Subscriber(server.port)
            subscriber.start()
            with ThreadPoolExecutor(N_CLIENTS) as pool:
                replies = list(
                    pool.map(
                        lambda client: run_client(
                            client, server.port, noises, N_REQUESTS, robot_id=f"arm-{client}"
                        ),
                        range(N_CLIENTS),
                    )
                )
        subscriber.join(timeout=30)
        session.stop()
    return {
        "replies": replies,
        "messages": subscriber.messages,
        "actions": actions,
        "texts": texts,
        "compiles": compiles.count,
    }


def finished_texts(replies: list[tuple[int, dict]]) -> list[dict]:
    return [reply for _, reply in replies if reply.get("text_done")]


def test_no_reply_lost_or_mixed(served):
    assert [len(replies) for replies in served["replies"]] == [N_REQUESTS] * N_CLIENTS
    for client, replies in enumerate(served["replies"]):
        for which, reply in replies:
            np.testing.assert_allclose(reply["actions"], served["actions"][client, which], atol=1e-5, rtol=0)
            assert reply["robot_id"] == f"arm-{client}"


def test_nothing_compiles_after_warmup(served):
    assert served["compiles"] == 0


def test_every_robot_completes_texts_equal_to_decoding_alone(served):
    for client, replies in enumerate(served["replies"]):
        alone = served["texts"][client]
        finished = finished_texts(replies)
        # Back-to-back robots: a decode chunk runs between every two batches, so texts keep completing.
        assert len(finished) >= N_REQUESTS // 10
        for reply in finished:
            np.testing.assert_array_equal(reply["text_tokens"], alone["text_tokens"])
            assert reply["text"] == alone["text"]


def test_each_text_is_reported_done_once_by_its_own_robot(served):
    owners: dict[int, int] = {}
    for client, replies in enumerate(served["replies"]):
        done = [reply["text_request_id"] for reply in finished_texts(replies)]
        assert len(done) == len(set(done)) and done == sorted(done)
        for _, reply in replies:
            if "text_request_id" in reply:
                assert owners.setdefault(reply["text_request_id"], client) == client


def test_text_stream_adds_up_to_each_replys_final_text(served):
    streams: dict[int, list[dict]] = {}
    for message in served["messages"]:
        streams.setdefault(message["request_id"], []).append(message)
    for client, replies in enumerate(served["replies"]):
        for reply in finished_texts(replies):
            stream = streams[reply["text_request_id"]]
            assert {message["robot_id"] for message in stream} == {f"arm-{client}"}
            assert [message["done"] for message in stream] == [False] * (len(stream) - 1) + [True]
            tokens = np.concatenate([message["tokens"] for message in stream])
            np.testing.assert_array_equal(tokens, reply["text_tokens"])
            assert stream[-1]["text"] == reply["text"] and stream[-1]["finish_reason"] == "length"


def test_text_stream_is_refused_by_a_server_without_one(policy):
    with (
        BackgroundServer(PolicyServerBackend(policy)) as server,
        pytest.raises(InvalidStatus, match="404"),
    ):
        websocket(server.port, "/text")
