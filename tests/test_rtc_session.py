"""The `rtc` protocol in the multi-robot session, on the fake engine (tests/fake_engine.py): per-robot last
chunks, guidance in shared batches, chunk ids, stale replies, the delay estimate and bad `rtc` values.

The fake engine's model-space actions are noise + num_steps, and a guided row's first `delay` actions are
its aligned previous chunk's, so every expected reply is computed here by hand and mapped to the robot's
action space with `Policy.finish`.
"""

import copy
import re

import numpy as np
import pytest
from conftest import E2E, make_policy, raw_observation
from fake_engine import FakeEngine

from oxygen_jax.client import protocol
from oxygen_jax.errors import InvalidRequest
from oxygen_jax.policies.request_options import RequestOptions
from oxygen_jax.robots.chunks import RtcError, align
from oxygen_jax.robots.robot import RobotRequest
from oxygen_jax.robots.robots import Robots
from oxygen_jax.runtime.runtime import RuntimeConfig

NOISE = np.asarray(E2E["in/noise"], np.float32).reshape(10, 32)
OTHER_NOISE = np.random.default_rng(5).standard_normal((10, 32)).astype(np.float32)


@pytest.fixture(scope="module")
def policy():
    """The tiny LIBERO policy's robot I/O over the fake engine."""
    policy = copy.copy(make_policy("dsi0", "float32"))
    policy.engine = FakeEngine(policy.engine.config)
    return policy


@pytest.fixture
def session(policy):
    session = Robots(policy, RuntimeConfig(max_slots=0, max_new_tokens=0, max_prefill_batch=4))
    yield session
    session.stop()


def _request(client: str, noise: np.ndarray = NOISE, rtc: dict | None = None) -> RobotRequest:
    return RobotRequest(client, raw_observation(), RequestOptions(noise=noise), rtc=rtc)


def _model(policy, noise: np.ndarray) -> np.ndarray:
    """The fake engine's plain model-space chunk for `noise`."""
    return noise + policy.num_steps


def _robot_actions(policy, model_actions: np.ndarray) -> np.ndarray:
    return policy.finish(policy.prepare(raw_observation()), model_actions)["actions"]


def _fields(reply: dict) -> tuple:
    return reply[protocol.CHUNK_ID], reply[protocol.START], reply[protocol.STALE]


def _refusal(session, request: RobotRequest) -> Exception:
    """The exception a lone request is answered with (it must be refused)."""
    [answer] = session.step([request])
    assert isinstance(answer, Exception), answer
    return answer


def test_plain_robots_get_plain_chunks_with_chunk_fields_and_warm_up_compiles_the_guided_program(
    policy, session
):
    first, second = session.step([_request("a")])[0], session.step([_request("a", OTHER_NOISE)])[0]
    np.testing.assert_allclose(first["actions"], _robot_actions(policy, _model(policy, NOISE)), atol=1e-6)
    assert (_fields(first), _fields(second)) == ((0, 0, False), (1, 0, False))
    assert session.metadata["rtc"] is True
    guided_sizes = [batch for name, batch in policy.engine.calls if name == "guided_denoise"]
    assert guided_sizes[-3:] == [1, 2, 4]  # warm-up: every prefill batch size
    assert policy.engine.calls[-1] == ("denoise", 1)  # plain robots keep the plain program


def test_an_rtc_robot_is_guided_towards_its_aligned_last_chunk_in_a_batch_with_a_plain_robot(policy, session):
    session.step([_request("a"), _request("b", OTHER_NOISE)])
    policy.engine.calls.clear()
    rtc = {"executed": 3, "delay": 2, "horizon": 6, protocol.CHUNK_ID: 0}
    guided, plain = session.step([_request("a", OTHER_NOISE, rtc), _request("b", NOISE)])
    assert policy.engine.calls == [("prefill", 2), ("guided_denoise", 2)]
    want = _model(policy, OTHER_NOISE)
    want[:2] = align(_model(policy, NOISE), 3)[:2]  # the fake guidance: the first `delay` actions
    np.testing.assert_allclose(guided["actions"], _robot_actions(policy, want), atol=1e-6)
    np.testing.assert_allclose(plain["actions"], _robot_actions(policy, _model(policy, NOISE)), atol=1e-6)
    assert (_fields(guided), _fields(plain)) == ((1, 2, False), (1, 0, False))
    assert guided["rtc_method"] == "guided" and "rtc_method" not in plain  # the method that ran


def test_bad_rtc_is_refused_for_that_robot_only_and_leaves_its_state(session):
    session.step([_request("a"), _request("b")])
    bad = {"executed": 3, "delay": 10, "horizon": 10}
    refused, answered = session.step([_request("a", rtc=bad), _request("b", rtc={"executed": 1, "delay": 1})])
    assert isinstance(refused, RtcError) and isinstance(refused, InvalidRequest)
    assert str(refused) == "rtc.delay 10 must be < the action horizon 10"
    assert _fields(answered) == (1, 1, False)
    good = {"executed": 3, "delay": 2, protocol.CHUNK_ID: 0}  # robot a's last chunk is still chunk 0
    assert _fields(session.step([_request("a", rtc=good)])[0]) == (1, 2, False)


@pytest.mark.parametrize(
    ("rtc", "message"),
    [
        ({"executed": -1, "delay": 2}, "rtc.executed must be >= 0"),
        ({"executed": 11, "delay": 2}, "rtc.executed 11 is beyond the last chunk's 10 actions"),
        ({"executed": 2, "delay": 4, "horizon": 3}, r"rtc.horizon 3 must lie in \[delay=4, 10\]"),
        ({"executed": 2, "delay": 1, "control_hz": -5}, r"rtc.control_hz must lie in \(0, 10000\]"),
        # inf and 1e308 once raised OverflowError (a server fault) in the delay estimate.
        ({"executed": 2, "delay": 1, "control_hz": float("inf")}, r"rtc.control_hz must lie in \(0"),
        ({"executed": 2, "delay": 1, "control_hz": 1e308}, r"rtc.control_hz must lie in \(0"),
        ({"executed": 2, "delay": 1, "control_hz": float("nan")}, r"rtc.control_hz must lie in \(0"),
        ({"executed": np.timedelta64(2), "delay": 1}, "rtc.executed must be an int"),
    ],
)
def test_bad_rtc_values_are_one_line_refusals(session, rtc, message):
    session.step([_request("a")])
    refused = _refusal(session, _request("a", rtc=rtc))
    assert isinstance(refused, RtcError)
    assert re.match(message, str(refused)) and "\n" not in str(refused)


def test_rtc_without_a_previous_chunk_is_refused(session):
    refused = _refusal(session, _request("new", rtc={"executed": 0, "delay": 1}))
    assert isinstance(refused, RtcError) and "needs a previous chunk" in str(refused)


def test_more_samples_than_the_session_draws_are_refused_with_one_line(session):
    request = RobotRequest("many", raw_observation(), RequestOptions(samples=4), rtc=None)
    refused = _refusal(session, request)
    assert (
        isinstance(refused, InvalidRequest)
        and str(refused) == "samples must lie in [1, 1] on this server, got 4"
    )
    assert "\n" not in str(refused)


def test_a_reply_overtaken_by_a_newer_request_of_its_robot_is_stale_and_not_the_last_chunk(session):
    """Two requests of one robot in flight together: the older reply is stale; the robot ignores it, so
    the server's last chunk for it stays the newer reply's (chunk 1), and chunk 0 is no longer current."""
    older, newer = session.step([_request("a"), _request("a", OTHER_NOISE)])
    assert (_fields(older), _fields(newer)) == ((0, 0, True), (1, 0, False))
    refused = _refusal(session, _request("a", rtc={"executed": 1, "delay": 1, protocol.CHUNK_ID: 0}))
    assert str(refused) == "rtc.chunk_id 0 is not the last chunk sent (1)"
    current = {"executed": 1, "delay": 1, protocol.CHUNK_ID: 1}
    assert _fields(session.step([_request("a", rtc=current)])[0]) == (2, 1, False)


def test_delay_is_estimated_from_the_measured_latency_and_the_robots_control_hz(session):
    session.step([_request("a")])
    refused = _refusal(session, _request("a", rtc={"executed": 2}))
    assert "control_hz is unknown" in str(refused)
    # Any latency under 1000 s is one control step at 1 mHz; the rate is remembered once stated.
    assert _fields(session.step([_request("a", rtc={"executed": 2, "control_hz": 1e-3})])[0])[1] == 1
    assert _fields(session.step([_request("a", rtc={"executed": 2})])[0])[1] == 1


def test_a_session_without_rtc_refuses_rtc_requests_and_compiles_no_guided_program(policy):
    session = Robots(policy, RuntimeConfig(max_slots=0, max_new_tokens=0, max_prefill_batch=4), rtc=False)
    try:
        policy.engine.calls.clear()
        session.step([_request("a")])
        refused = _refusal(session, _request("a", rtc={"executed": 1, "delay": 1}))
        assert isinstance(refused, InvalidRequest) and "does not take real-time-chunking" in str(refused)
        assert all(name != "guided_denoise" for name, _ in policy.engine.calls)
    finally:
        session.stop()
