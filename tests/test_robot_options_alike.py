"""`samples` (several chunks from one prefill, the densest kept) and `rtc` alike on every path:
`Policy.infer` or a local robot (`LocalRobot`), the inline server (`PolicyServerBackend`) and the
streaming server (`Robots` on the runtime), on the tiny golden model in float32.

The streaming server denoises a request's samples on its row of a prefill batch padded to a bucket, so its
chunks may differ from `Policy.infer`'s by float32 rounding of the batched reductions (ulps): compared to
1e-5, as tests/test_rtc_serving.py compares batched rows.
"""

import numpy as np
import pytest
from conftest import OPENPI_CLIENT_WARNING, make_policy, openpi_client, raw_observation

from oxygen_jax.client import protocol
from oxygen_jax.engine.compile_counter import CompileCounter
from oxygen_jax.errors import InvalidRequest
from oxygen_jax.policies.request_options import RequestOptions
from oxygen_jax.robots.local import LocalRobot
from oxygen_jax.robots.robot import RobotRequest
from oxygen_jax.robots.robots import Robots
from oxygen_jax.runtime.runtime import RuntimeConfig
from oxygen_jax.serving.policy_backend import PolicyServerBackend, SessionServerBackend
from oxygen_jax.serving.websocket_server import BackgroundServer

# openpi-client pins numpy<2, so CI installs it with `pip install --no-deps openpi-client`.
pytest.importorskip("openpi_client.websocket_client_policy")

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300), OPENPI_CLIENT_WARNING]

SAMPLES = 3  # padded to 4 rows by the runtime
ATOL = 1e-5


def _noise(seed: int, samples: int = SAMPLES) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((samples, 10, 32)).astype(np.float32)


@pytest.fixture(scope="module")
def policy():
    return make_policy("dsi0", "float32")


@pytest.fixture(scope="module")
def session(policy):
    config = RuntimeConfig(max_slots=0, max_new_tokens=0, max_prefill_batch=2)
    session = Robots(policy, config, max_samples=4)
    session.warmup(raw_observation())
    yield session
    session.stop()


def _chunks(policy, noise: np.ndarray) -> np.ndarray:
    """Every sample's chunk as the robot executes it, one request per sample."""
    return np.stack([policy.infer(raw_observation(), noise=one)["actions"] for one in noise])


def test_the_same_samples_give_the_same_actions_on_every_path(policy, session):
    noise = _noise(0)
    want = policy.infer(raw_observation(), noise=noise, samples=SAMPLES)["actions"]
    chunks = _chunks(policy, noise)
    # The request's chunks differ and the kept one is among them: the choice is tested, not one sample.
    assert min(np.abs(a - b).max() for i, a in enumerate(chunks) for b in chunks[i + 1 :]) > 100 * ATOL
    assert min(np.abs(chunk - want).max() for chunk in chunks) < ATOL
    assert np.abs(chunks[0] - want).max() > 100 * ATOL  # a path that drew one chunk would fail
    request = raw_observation() | {"noise": noise, "samples": SAMPLES}
    with BackgroundServer(PolicyServerBackend(policy, metrics=False)) as inline:
        np.testing.assert_array_equal(openpi_client(inline.port).infer(request)["actions"], want)
    # The warm session compiled the samples' shapes: serving them compiles nothing.
    streaming = BackgroundServer(SessionServerBackend(session, metrics=False))
    with streaming, CompileCounter() as compiles:
        got = openpi_client(streaming.port).infer(request)["actions"]
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)
    assert compiles.count == 0


def test_a_batch_mixing_samples_and_single_chunks_answers_each_as_alone(policy, session):
    many, one = _noise(2), _noise(3, 1)  # seed 2 keeps its second sample
    replies = session.step(
        [
            RobotRequest("many", raw_observation(), RequestOptions(noise=many, samples=SAMPLES)),
            RobotRequest("one", raw_observation(), RequestOptions(noise=one[0])),
        ]
    )
    want_many = policy.infer(raw_observation(), noise=many, samples=SAMPLES)["actions"]
    want_one = policy.infer(raw_observation(), noise=one[0])["actions"]
    np.testing.assert_allclose(replies[0]["actions"], want_many, rtol=0, atol=ATOL)
    np.testing.assert_allclose(replies[1]["actions"], want_one, rtol=0, atol=ATOL)


def test_more_samples_than_the_session_draws_are_refused_with_one_line(session):
    (reply,) = session.step([RobotRequest("big", raw_observation(), RequestOptions(samples=5))])
    assert isinstance(reply, InvalidRequest)
    assert str(reply) == "samples must lie in [1, 4] on this server, got 5"
    assert session.metadata["max_samples"] == 4


def _continued(executed: int, delay: int) -> dict:
    return raw_observation() | {protocol.RTC: {"executed": executed, "delay": delay}}


def test_the_same_rtc_requests_give_the_same_actions_on_every_path(policy, session):
    """A robot's first chunk, then a chunk continuing it (`rtc`), with the same noise: a local robot, the
    inline server and the streaming server answer alike (the streaming one to batch rounding)."""
    first, then = _noise(4, 1)[0], _noise(5, 1)[0]
    local = LocalRobot(policy, fresh_samples=1)
    want = [local.infer(raw_observation(), noise=first), local.infer(_continued(3, 2), noise=then)]
    assert want[1]["rtc_method"] == "guided" and want[1][protocol.START] == 2
    plain = policy.infer(raw_observation(), noise=then)["actions"]
    assert np.abs(plain - want[1]["actions"]).max() > 100 * ATOL  # the guidance changed the chunk
    requests = [raw_observation() | {"noise": first}, _continued(3, 2) | {"noise": then}]
    with BackgroundServer(PolicyServerBackend(policy, metrics=False)) as inline:
        client = openpi_client(inline.port)
        inline_replies = [client.infer(request) for request in requests]
    with BackgroundServer(SessionServerBackend(session, metrics=False)) as streaming:
        client = openpi_client(streaming.port)
        streamed = [client.infer(request) for request in requests]
    for got_inline, got_streamed, expected in zip(inline_replies, streamed, want, strict=True):
        np.testing.assert_array_equal(got_inline["actions"], expected["actions"])
        np.testing.assert_allclose(got_streamed["actions"], expected["actions"], rtol=0, atol=ATOL)
        for reply in (got_inline, got_streamed):
            assert reply[protocol.START] == expected[protocol.START]
            assert reply.get("rtc_method") == expected.get("rtc_method")
