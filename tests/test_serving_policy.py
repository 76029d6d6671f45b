"""A tiny pi0.5 Policy served in-process to the real openpi client on loopback."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import OPENPI_CLIENT_WARNING, make_policy, openpi_client, raw_observation

from oxygen_jax.serving.policy_backend import PolicyServerBackend
from oxygen_jax.serving.websocket_server import BackgroundServer

# openpi-client pins numpy<2, so CI installs it with `pip install --no-deps openpi-client`.
pytest.importorskip("openpi_client.websocket_client_policy")

pytestmark = [pytest.mark.timeout(60), OPENPI_CLIENT_WARNING]

N_CLIENTS = 4
N_REQUESTS = 50
# Distinct noises whose answers are computed locally; request r of client c uses (c + r) % N_NOISES, so
# requests in flight together carry different noises and a reply given to the wrong request shows.
N_NOISES = 8
MAX_TEXT_TOKENS = 4


@pytest.fixture(scope="module")
def policy():
    return make_policy("dsi0", max_text_tokens=MAX_TEXT_TOKENS)


@pytest.fixture(scope="module")
def server(policy):
    with BackgroundServer(PolicyServerBackend(policy)) as running:
        yield running


@pytest.fixture(scope="module")
def noises() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((N_NOISES, 10, 32)).astype(np.float32)


def connect(server: BackgroundServer):
    return openpi_client(server.port)


def test_metadata_reaches_the_client(server, policy):
    assert connect(server).get_server_metadata() == policy.metadata


def test_served_answer_equals_local_infer(server, policy, noises):
    served = connect(server).infer(raw_observation() | {"noise": noises[0]})
    local = policy.infer(raw_observation(), noise=noises[0])
    np.testing.assert_array_equal(served["actions"], local["actions"])
    assert served["text"] == local["text"]
    np.testing.assert_array_equal(served["text_tokens"], local["text_tokens"])
    assert served["text_done"] is True
    assert served["policy_timing"]["infer_ms"] > 0


def test_request_options_limit_the_text(server):
    client = connect(server)
    short = client.infer(raw_observation() | {"max_text_tokens": 2, "temperature": 0.5})
    assert len(short["text_tokens"]) <= 2
    silent = client.infer(raw_observation() | {"max_text_tokens": 0})
    assert "text" not in silent and "text_done" not in silent


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        ({"observation/state": None}, "observation/state"),
        ({"observation/state": np.full(8, np.nan)}, "observation/state"),
        ({"noise": np.zeros((10, 7), np.float32)}, "noise"),
        ({"max_text_tokens": "many"}, "max_text_tokens"),
        # A numpy timedelta64 is an np.integer: it used to pass as an integer option.
        (
            {"max_text_tokens": np.timedelta64(2)},
            "'max_text_tokens': expected an integer, got timedelta64",
        ),
        ({"text_tasks": {"t": {"instruction": "say", "max_text_tokens": np.timedelta64(2)}}}, "text task t"),
        # Newlines and terminal escapes would reach replies, /text and logs.
        ({"robot_id": "arm\n\x1b[31m-1"}, "'robot_id': expected a printable string"),
        ({"robot_id": "a" * 65}, "'robot_id': expected a printable string of 1 to 64 characters"),
    ],
)
def test_bad_request_is_named_and_the_client_keeps_working(server, noises, bad, named):
    client = connect(server)
    obs = {key: value for key, value in (raw_observation() | bad).items() if value is not None}
    with pytest.raises(RuntimeError, match=f"Bad request: .*{named}"):
        client.infer(obs)
    assert client.infer(raw_observation() | {"noise": noises[0]})["actions"].shape == (10, 7)


@pytest.mark.integration
def test_concurrent_clients_get_their_own_answers(server, policy, noises):
    expected = [policy.infer(raw_observation(), noise=noise)["actions"] for noise in noises]

    def run_client(index: int) -> list[tuple[int, np.ndarray]]:
        client = connect(server)
        replies = []
        for request in range(N_REQUESTS):
            which = (index + request) % N_NOISES
            reply = client.infer(raw_observation() | {"noise": noises[which], "max_text_tokens": 0})
            replies.append((which, reply["actions"]))
        return replies

    with ThreadPoolExecutor(N_CLIENTS) as pool:
        results = list(pool.map(run_client, range(N_CLIENTS)))
    assert [len(replies) for replies in results] == [N_REQUESTS] * N_CLIENTS
    for replies in results:
        for which, actions in replies:
            np.testing.assert_array_equal(actions, expected[which])


@pytest.mark.integration
def test_text_tasks_in_a_request_reply_one_text_per_task(server, policy, noises):
    """Three named tasks from one served request equal the local Policy.infer with the same tasks; a
    bad task fails that request only, with a one-line error."""
    tasks = {"subtask": "next subtask", "narration": "describe it", "memory": {"instruction": "the cup?"}}
    client = connect(server)
    served = client.infer(raw_observation() | {"noise": noises[1], "text_tasks": tasks})
    local = policy.infer(raw_observation(), noise=noises[1], text_tasks=tasks)
    np.testing.assert_array_equal(served["actions"], local["actions"])
    assert served["texts"] == local["texts"] and list(served["texts"]) == list(tasks)
    for name in tasks:
        np.testing.assert_array_equal(served["texts_tokens"][name], local["texts_tokens"][name])
    with pytest.raises(Exception, match="non-empty 'instruction'"):
        client.infer(raw_observation() | {"text_tasks": {"empty": ""}})
    assert "actions" in connect(server).infer(raw_observation())
