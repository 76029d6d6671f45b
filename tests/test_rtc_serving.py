"""The `rtc` protocol over the wire: openpi-client and the `client/` executor against the in-process
session server (`SessionServerBackend` in `BackgroundServer`) on the tiny golden model, float32.

Matched: a client without `rtc` gets `Policy.infer`'s actions for the same noise; an `rtc` client's guided
reply equals `Engine.denoise` of its observation alone, guided towards its first chunk aligned by the
actions it executed, through the robot's output transforms (both to 1e-5: the server may batch the row
with padding, which changes float32 reductions by ulps).
"""

import numpy as np
import pytest
from conftest import (
    E2E,
    OPENPI_CLIENT_WARNING,
    GoldenRobot,
    make_policy,
    openpi_client,
    raw_observation,
    serve_script,
)

from oxygen_jax.client import Executor, ExecutorConfig, protocol
from oxygen_jax.engine.api import ChunkGuidance
from oxygen_jax.engine.compile_counter import CompileCounter
from oxygen_jax.models import inputs
from oxygen_jax.policies.request_options import RequestOptions
from oxygen_jax.robots.chunks import align
from oxygen_jax.robots.robots import Robots
from oxygen_jax.runtime.runtime import RuntimeConfig
from oxygen_jax.serving.policy_backend import SessionServerBackend
from oxygen_jax.serving.websocket_server import BackgroundServer

# openpi-client pins numpy<2, so CI installs it with `pip install --no-deps openpi-client`.
pytest.importorskip("openpi_client.websocket_client_policy")

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300), OPENPI_CLIENT_WARNING]

NOISE = np.asarray(E2E["in/noise"], np.float32).reshape(10, 32)
OTHER_NOISE = np.random.default_rng(5).standard_normal((10, 32)).astype(np.float32)
ATOL = 1e-5


@pytest.fixture(scope="module")
def policy():
    return make_policy("dsi0", "float32")


@pytest.fixture(scope="module")
def server(policy):
    session = Robots(policy, RuntimeConfig(max_slots=0, max_new_tokens=0, max_prefill_batch=2))
    session.warmup(raw_observation())
    with BackgroundServer(SessionServerBackend(session)) as server:
        yield server
    session.stop()


def _model_actions(policy, noise: np.ndarray, guidance: ChunkGuidance | None = None) -> np.ndarray:
    """The model-space chunk of the raw observation alone with `noise`, guided as given."""
    arrays = {k: np.asarray(v)[None] for k, v in policy.model_inputs(raw_observation()).items()}
    cache = policy.engine.prefill(inputs.observation_from_arrays(arrays, policy.engine.config))
    return np.asarray(policy.engine.denoise(cache, noise[None], policy.num_steps, [guidance]))[0]


def _robot_actions(policy, model_actions: np.ndarray) -> np.ndarray:
    return policy.finish(policy.prepare(raw_observation(), RequestOptions()), model_actions)["actions"]


def test_an_unmodified_client_gets_plain_chunks(policy, server):
    reply = openpi_client(server.port).infer(raw_observation() | {"noise": NOISE})
    want = policy.infer(raw_observation(), noise=NOISE)["actions"]
    np.testing.assert_allclose(reply["actions"], want, rtol=0, atol=ATOL)
    assert (reply[protocol.START], reply[protocol.STALE]) == (0, False)


def test_an_rtc_clients_reply_is_the_engines_guided_chunk_towards_its_aligned_last_chunk(policy, server):
    connection = openpi_client(server.port)
    first = connection.infer(raw_observation() | {"noise": NOISE})
    rtc = protocol.rtc_request(executed=3, delay=2, horizon=6, chunk_id=first[protocol.CHUNK_ID])
    guided = connection.infer(raw_observation() | {"noise": OTHER_NOISE, protocol.RTC: rtc})
    previous = _model_actions(policy, NOISE)
    want = _model_actions(policy, OTHER_NOISE, ChunkGuidance(align(previous, 3), 2, 6))
    np.testing.assert_allclose(guided["actions"], _robot_actions(policy, want), rtol=0, atol=ATOL)
    plain = _robot_actions(policy, _model_actions(policy, OTHER_NOISE))
    assert np.abs(guided["actions"] - plain).max() > 100 * ATOL  # the guidance changed the chunk
    assert guided[protocol.CHUNK_ID] == first[protocol.CHUNK_ID] + 1
    assert (guided[protocol.START], guided[protocol.STALE]) == (2, False)


def test_a_bad_rtc_is_refused_for_that_robot_only_while_another_continues(policy, server):
    bad_robot, other_robot = openpi_client(server.port), openpi_client(server.port)
    bad_robot.infer(raw_observation() | {"noise": NOISE})
    other_robot.infer(raw_observation() | {"noise": NOISE})
    with pytest.raises(RuntimeError, match=r"Bad request: rtc\.delay 10 must be < the action horizon 10"):
        bad_robot.infer(raw_observation() | {protocol.RTC: {"executed": 2, "delay": 10}})
    rtc = {"executed": 2, "delay": 1}
    assert other_robot.infer(raw_observation() | {protocol.RTC: rtc})[protocol.START] == 1
    # The refused robot's connection and last chunk are as they were.
    assert (
        bad_robot.infer(raw_observation() | {protocol.RTC: rtc | {protocol.CHUNK_ID: 0}})[protocol.START] == 1
    )


def test_the_executor_drives_a_served_robot_in_rtc_mode(server):
    """A few chunks at 10 Hz, asking for the next one 5 actions before the end: every request after the
    first carries `rtc`, every reply starts where its request's delay said, chunk ids follow each other,
    and the warm server compiles nothing."""
    config = ExecutorConfig(control_hz=10.0, execution_horizon=5, mode="rtc")
    connection = openpi_client(server.port)
    sent, replies = [], []

    def infer(obs: dict) -> dict:
        sent.append(obs.get(protocol.RTC))
        replies.append(connection.infer(obs))
        return replies[-1]

    robot = GoldenRobot()
    with CompileCounter() as compiles:  # guided and plain requests of a warm server compile nothing
        stats = Executor(config, robot, infer=infer).run(32)
    assert len(stats.switches) >= 3 and stats.stale_replies == 0
    assert sent[0] is None and all(rtc is not None for rtc in sent[1:])
    answered = len(replies)  # the last request may still be in flight
    assert [reply[protocol.START] for reply in replies[:answered]] == [0] + [
        rtc["delay"] for rtc in sent[1:answered]
    ]
    ids = [s.chunk_id for s in stats.switches]
    assert ids == list(range(ids[0], ids[0] + len(ids)))
    assert compiles.count == 0
    assert len(robot.executed) == stats.actions and robot.executed[0].shape == (7,)


def test_serve_script_with_nortc_serves_plain_chunks_and_refuses_rtc(tmp_path):
    with serve_script(tmp_path, "--nortc") as (_, port):
        connection = openpi_client(port)
        assert connection.get_server_metadata()["rtc"] is False
        reply = connection.infer(raw_observation() | {"noise": NOISE})
        assert (reply[protocol.CHUNK_ID], reply[protocol.START], reply[protocol.STALE]) == (0, 0, False)
        rtc = {"executed": 2, "delay": 1}
        with pytest.raises(
            RuntimeError, match="Bad request: rtc: this server does not take real-time-chunking"
        ):
            connection.infer(raw_observation() | {protocol.RTC: rtc})
