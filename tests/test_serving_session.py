"""Several robots served at once through the frame-loop session, with streamed language, and serve.py."""

import itertools
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import (
    E2E,
    FORCED_DEVICES,
    MAX_TEXT_TOKENS,
    OPENPI_CLIENT_WARNING,
    answers_alone,
    client_observation,
    make_policy,
    openpi_client,
    raw_observation,
    run_client,
    serve_script,
    text_budget,
    websocket,
)

from oxygen_jax.engine.compile_counter import CompileCounter
from oxygen_jax.robots.robots import Robots
from oxygen_jax.runtime.requests import RequestStatus
from oxygen_jax.runtime.runtime import RuntimeConfig
from oxygen_jax.serving import msgpack_numpy
from oxygen_jax.serving.policy_backend import SessionServerBackend
from oxygen_jax.serving.websocket_server import BackgroundServer
from oxygen_jax.table_task import scenes as table_scenes

# openpi-client pins numpy<2, so CI installs it with `pip install --no-deps openpi-client`.
pytest.importorskip("openpi_client.websocket_client_policy")

pytestmark = [pytest.mark.timeout(120), OPENPI_CLIENT_WARNING]

N_CLIENTS = 3
N_REQUESTS = 20
N_NOISES = 4


def frame_loop(max_slots: int, **config) -> RuntimeConfig:
    """The paper's frame loop, one decode step per frame, up to four observations per prefill."""
    return RuntimeConfig(
        max_slots=max_slots, max_new_tokens=MAX_TEXT_TOKENS, loop="frame", k=1, max_prefill_batch=4, **config
    )


@pytest.fixture(scope="module")
def session(policy):
    """The frame loop: a robot's text advances k tokens per frame, so it streams over its replies."""
    session = Robots(policy, frame_loop(N_CLIENTS + 1, gather_s=0.02))
    session.warmup(raw_observation())
    yield session
    session.stop()


@pytest.fixture(scope="module")
def noises() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((N_NOISES, 10, 32)).astype(np.float32)


@pytest.fixture(scope="module")
def served(policy, session, noises):
    """Every client's replies (noise index, reply) from one concurrent run, with its engine and compile
    counts, and what `Policy.infer` answers each observation alone (computed while the server is idle)."""
    actions, texts = answers_alone(policy, noises, N_CLIENTS)

    prefills = policy.engine.stats.prefill_calls
    with (
        BackgroundServer(SessionServerBackend(session)) as server,
        ThreadPoolExecutor(N_CLIENTS) as pool,
        CompileCounter() as compiles,
    ):
        replies = list(
            pool.map(lambda client: run_client(client, server.port, noises, N_REQUESTS), range(N_CLIENTS))
        )
    return {
        "replies": replies,
        "actions": actions,
        "texts": texts,
        "prefill_calls": policy.engine.stats.prefill_calls - prefills,
        "compiles": compiles.count,
    }


def language_requests(replies: list[tuple[int, dict]]) -> dict[int, list[dict]]:
    """A client's replies grouped by the language request they report, in order."""
    grouped: dict[int, list[dict]] = {}
    for _, reply in replies:
        grouped.setdefault(reply["text_request_id"], []).append(reply)
    return grouped


def test_no_request_lost_or_mixed(served):
    assert [len(replies) for replies in served["replies"]] == [N_REQUESTS] * N_CLIENTS
    for client, replies in enumerate(served["replies"]):
        for which, reply in replies:
            np.testing.assert_allclose(reply["actions"], served["actions"][client, which], atol=1e-5, rtol=0)


def test_observations_of_a_frame_are_prefilled_together_without_compiling(served):
    assert 0 < served["prefill_calls"] < N_CLIENTS * N_REQUESTS
    assert served["compiles"] == 0


def test_text_streams_across_a_clients_requests(served):
    owners: dict[int, int] = {}
    for client, replies in enumerate(served["replies"]):
        grouped = language_requests(replies)
        assert len(grouped) >= 2  # a finished request is followed by a new one
        for request_id, reports in grouped.items():
            assert owners.setdefault(request_id, client) == client
            lengths = [len(report["text_tokens"]) for report in reports]
            assert lengths == sorted(lengths) and lengths[0] < text_budget(client)
            for earlier, later in itertools.pairwise(reports):
                np.testing.assert_array_equal(
                    later["text_tokens"][: len(earlier["text_tokens"])], earlier["text_tokens"]
                )
            assert [report["text_done"] for report in reports[:-1]] == [False] * (len(reports) - 1)
        done = [reports[-1] for reports in grouped.values() if reports[-1]["text_done"]]
        assert len(done) >= len(grouped) - 1  # only the last may still be running


def test_each_reply_names_the_request_it_started_and_the_observation_its_text_describes(served):
    """Replies count the robot's observations; a language request is started by exactly one of them, and
    every reply reporting that request's text names that observation, which came no later."""
    for client_replies in served["replies"]:
        replies = [reply for _, reply in client_replies]
        assert [reply["observation_index"] for reply in replies] == list(range(N_REQUESTS))
        started = {
            reply["text_request_started"]: reply["observation_index"]
            for reply in replies
            if reply["text_request_started"] is not None
        }
        assert len(started) == sum(reply["text_request_started"] is not None for reply in replies)
        reported = [reply for reply in replies if "text_request_id" in reply]
        assert reported
        for reply in reported:
            observation = started[reply["text_request_id"]]
            assert reply["text_observation_index"] == observation <= reply["observation_index"]


def test_finished_text_equals_the_observation_decoded_alone(served):
    for client, replies in enumerate(served["replies"]):
        alone = served["texts"][client]
        finished = [
            reports[-1] for reports in language_requests(replies).values() if reports[-1]["text_done"]
        ]
        assert finished
        for reply in finished:
            np.testing.assert_array_equal(reply["text_tokens"], alone["text_tokens"])
            assert reply["text"] == alone["text"]


def test_a_client_that_leaves_frees_its_language_slot(policy):
    session = Robots(policy, frame_loop(N_CLIENTS + 1))
    session.warmup(raw_observation())
    manager = session.runtime.manager
    with BackgroundServer(SessionServerBackend(session)) as server:
        with websocket(server.port) as leaver:
            leaver.recv()  # Metadata.
            leaver.send(msgpack_numpy.packb(client_observation(0) | {"max_text_tokens": MAX_TEXT_TOKENS}))
            reply = msgpack_numpy.unpackb(leaver.recv(timeout=30))
            assert reply["text_done"] is False and manager.active == 1
        deadline = time.monotonic() + 10
        while manager.active and time.monotonic() < deadline:  # no frame runs meanwhile: only the cancel
            time.sleep(0.01)
        assert manager.active == 0
        assert manager.status(reply["text_request_id"]) == RequestStatus.UNKNOWN and manager.tracked == 0
        stayer = openpi_client(server.port)
        assert stayer.infer(client_observation(1))["text_done"] is False
        assert manager.active == 1
    session.stop()


@pytest.fixture(scope="module")
def golden_server(tmp_path_factory):
    with serve_script(
        tmp_path_factory.mktemp("serve"), "--config.model.discrete_state_input=False"
    ) as running:
        yield running


def golden_observation() -> dict:
    return raw_observation() | {"noise": E2E["in/noise"]}


@pytest.mark.integration
def test_serve_script_answers_like_openpi(golden_server):
    _, port = golden_server
    client = openpi_client(port)
    assert client.get_server_metadata()["action_horizon"] == 10
    reply = client.infer(golden_observation())
    np.testing.assert_allclose(reply["actions"], E2E["out/dsi0/actions"], atol=1e-4, rtol=0)


@pytest.mark.integration
def test_serve_script_names_a_malformed_request_while_another_client_continues(golden_server):
    _, port = golden_server
    results: list[np.ndarray] = []

    def bystander() -> None:
        client = openpi_client(port)
        results.extend(client.infer(golden_observation())["actions"] for _ in range(5))

    thread = threading.Thread(target=bystander)
    thread.start()
    client = openpi_client(port)
    malformed = {key: value for key, value in golden_observation().items() if key != "observation/state"}
    with pytest.raises(RuntimeError, match=r"Bad request: .*observation/state"):
        client.infer(malformed)
    np.testing.assert_allclose(
        client.infer(golden_observation())["actions"], E2E["out/dsi0/actions"], atol=1e-4
    )
    thread.join(timeout=60)
    assert len(results) == 5
    for actions in results:
        np.testing.assert_allclose(actions, E2E["out/dsi0/actions"], atol=1e-4, rtol=0)


@pytest.mark.integration
def test_serve_script_on_the_demo_model_says_each_scenes_subtask_and_reaches_its_cube(tmp_path):
    """`serve.py --config=pi05_demo` (its shipped checkpoint, streamed language): a table robot sending
    held-out scenes gets each scene's true subtask over its replies and actions near the true chunk.

    A reply's text may describe an earlier observation (the previous scene's request can finish in this
    scene's replies), so each scene waits for the finished text of a request one of its own observations
    started, as the replies name it (`text_request_started`, `text_request_id`, `text_observation_index`)."""
    scenes = table_scenes.scenes(table_scenes.HELD_OUT_SEED)
    demo = ("--config=pi05_demo",)
    with serve_script(tmp_path, "--max_text_tokens=12", golden=False, model=demo) as (_, port):
        client = openpi_client(port)
        for _ in range(3):
            scene = next(scenes)
            own: dict[int, int] = {}  # request id -> observation index, of this scene's observations
            for _ in range(50):
                reply = client.infer(scene.observation(0))
                if reply["text_request_started"] is not None:
                    own[reply["text_request_started"]] = reply["observation_index"]
                if reply.get("text_done") and reply["text_request_id"] in own:
                    break
            assert reply["text_done"] and reply["text_request_id"] in own, "no text of this scene finished"
            assert reply["text_observation_index"] == own[reply["text_request_id"]]
            assert reply["text"] == scene.subtask
            errors = (reply["actions"] - scene.action_chunk(0, len(reply["actions"]))) ** 2
            assert errors.mean() < 0.02, errors.mean()


@pytest.mark.integration
def test_serve_script_exits_cleanly_on_sigterm(golden_server):
    process, _ = golden_server
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0


@pytest.mark.integration
def test_serve_script_takes_config_overrides(tmp_path_factory):
    flags = ("--config.model.discrete_state_input=False", "--config.model.action_horizon=16")
    with serve_script(tmp_path_factory.mktemp("serve"), *flags) as (process, port):
        client = openpi_client(port)
        assert client.get_server_metadata()["action_horizon"] == 16
        assert client.infer(raw_observation())["actions"].shape == (16, 7)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0


@pytest.mark.integration
@pytest.mark.timeout(300)  # two meshes' programs to compile before the server answers
def test_serve_script_round_trip_on_a_2x2_mesh(tmp_path_factory):
    """Two robots against serve.py on a data:2,model:2 mesh get openpi's actions and the text the
    single-device policy decodes."""
    flags = (
        "--config.model.discrete_state_input=False",
        "--config.engine.mesh=data:2,model:2",
        "--max_text_tokens=4",
        "--max_slots=2",
        "--max_batch=2",
    )
    alone = make_policy("dsi0", max_text_tokens=4).infer(golden_observation())
    with serve_script(tmp_path_factory.mktemp("serve"), *flags, env=FORCED_DEVICES) as (_, port):

        def robot(_: int) -> list[dict]:
            """Observations until the robot's first language request reports done (at most 50)."""
            client = openpi_client(port)
            replies = [client.infer(golden_observation())]
            while not replies[-1].get("text_done") and len(replies) < 50:
                time.sleep(0.05)
                replies.append(client.infer(golden_observation()))
            return replies

        with ThreadPoolExecutor(2) as pool:
            replies = [reply for replies in pool.map(robot, range(2)) for reply in replies]
    for reply in replies:
        np.testing.assert_allclose(reply["actions"], E2E["out/dsi0/actions"], atol=1e-4, rtol=0)
    finished = [reply for reply in replies if reply.get("text_done")]
    assert finished
    for reply in finished:
        np.testing.assert_array_equal(reply["text_tokens"], alone["text_tokens"])
