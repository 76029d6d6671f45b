"""One robot's bad input never reaches another: each request is checked and canonicalized on its own."""

import copy
import logging

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import numpy as np
import pytest
from conftest import make_policy, raw_observation
from fake_engine import FakeEngine
from hypothesis import HealthCheck, given, settings

from oxygen_jax.errors import InvalidRequest
from oxygen_jax.policies.request_options import RequestOptions
from oxygen_jax.robots.robot import RobotRequest
from oxygen_jax.robots.robots import Robots
from oxygen_jax.runtime.runtime import RuntimeConfig

pytestmark = pytest.mark.timeout(120)

# The text budget: the parametrized requests before test_text_keeps_advancing_next_to_bad_requests
# advance the healthy robot's text 12 tokens in all, so at 4 that test starts on a fresh text.
MAX_TEXT_TOKENS = 4


def nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"x": value}
    return value


BAD_INPUTS = {
    "string state": ({"observation/state": "abc"}, "observation/state"),
    "3-value LIBERO state": ({"observation/state": np.zeros(3)}, "observation/state"),
    "uint16 image": ({"observation/image": np.zeros((224, 224, 3), np.uint16)}, "observation/image"),
    "float image out of [0, 1]": ({"observation/image": np.full((224, 224, 3), 2.0)}, "observation/image"),
    "deep nesting": ({"observation/state": nested(1000)}, "observation/state"),
    "prompt not a string": ({"prompt": 7}, "prompt"),
    "huge prompt": ({"prompt": "a" * 100_000}, "prompt"),
}
BAD_OPTIONS = {
    "temperature inf": ({"temperature": float("inf")}, "temperature"),
    "temperature nan": ({"temperature": float("nan")}, "temperature"),
    "top_p zero": ({"top_p": 0.0}, "top_p"),
    "max_text_tokens too many": ({"max_text_tokens": MAX_TEXT_TOKENS + 1}, "max_text_tokens"),
}


@pytest.fixture(scope="module")
def policy():
    return make_policy("dsi0", max_text_tokens=MAX_TEXT_TOKENS)


@pytest.fixture(scope="module")
def session(policy):
    # The frame loop: text advances exactly one token per request, which the tests below count.
    session = Robots(
        policy,
        RuntimeConfig(max_slots=4, max_new_tokens=MAX_TEXT_TOKENS, loop="frame", k=1, max_prefill_batch=4),
    )
    session.warmup(raw_observation())
    yield session
    session.stop()


@pytest.fixture(scope="module")
def healthy_actions(policy, noise) -> np.ndarray:
    return policy.infer(raw_observation(), noise=noise, prompt_for_text=False)["actions"]


def _groups(session: Robots, client: str) -> list:
    """The robot's language requests still to report (none for a robot never served)."""
    robot = session._robots._robots.get(client)  # `get` would add it
    return robot.groups if robot else []


def healthy(noise: np.ndarray) -> RobotRequest:
    return RobotRequest("healthy", raw_observation(), RequestOptions(noise=noise))


@pytest.mark.parametrize("case", list(BAD_INPUTS) + list(BAD_OPTIONS))
def test_a_bad_request_gets_its_own_error_and_the_frame_goes_on(session, noise, healthy_actions, case):
    bad, named = BAD_INPUTS[case] if case in BAD_INPUTS else BAD_OPTIONS[case]
    if case in BAD_INPUTS:
        attacker = RobotRequest("attacker", raw_observation() | bad)
    else:
        attacker = RobotRequest("attacker", raw_observation(), RequestOptions(**bad))
    good, refused = session.step([healthy(noise), attacker])
    assert isinstance(refused, ValueError) and named in str(refused)
    assert "\n" not in str(refused)
    np.testing.assert_array_equal(good["actions"], healthy_actions)


@pytest.mark.parametrize("shape", [(1, 5000, 3), (3, 1, 5000), (5000, 1, 3)])
def test_an_image_too_elongated_to_resize_is_refused_in_one_line(policy, shape):
    """A 1x5000 image once resized to height 0 (a ValueError: a server fault); now it is a bad request."""
    obs = raw_observation() | {"observation/image": np.zeros(shape, np.uint8)}
    with pytest.raises(InvalidRequest, match=r"'observation/image': a .* image is too elongated to resize"):
        policy.prepare(obs, RequestOptions())
    elongated_but_usable = raw_observation() | {"observation/image": np.zeros((2, 448, 3), np.uint8)}
    prepared = policy.prepare(elongated_but_usable, RequestOptions())
    assert prepared.arrays["image/base_0_rgb"].shape[-3:] == (224, 224, 3)


def test_an_extra_actions_key_is_ignored_and_harms_no_one(session, noise, healthy_actions):
    attacker = RobotRequest(
        "attacker", raw_observation() | {"actions": np.zeros((10, 7))}, RequestOptions(noise=noise)
    )
    good, other = session.step([healthy(noise), attacker])
    # A batch of two rounds differently from a batch of one: float32 rounding only.
    np.testing.assert_allclose(good["actions"], healthy_actions, atol=1e-5, rtol=0)
    np.testing.assert_allclose(other["actions"], healthy_actions, atol=1e-5, rtol=0)


def test_text_keeps_advancing_next_to_bad_requests(session, noise):
    """The healthy robot's language request grows every frame; a refused robot registers none."""
    lengths = []
    for _ in range(6):
        attacker = RobotRequest("refused", raw_observation() | {"observation/state": "abc"})
        good, _ = session.step([healthy(noise), attacker])
        lengths.append(len(good["text_tokens"]))
        if good["text_done"]:
            break
    assert lengths == list(range(1, len(lengths) + 1)) and lengths[-1] == MAX_TEXT_TOKENS
    assert not _groups(session, "refused")


def test_a_failing_model_call_is_retried_row_by_row(session, noise, healthy_actions, monkeypatch):
    """A frame whose model call fails is retried one request at a time: only the one that fails again
    gets the error, and no language request it started is left behind."""
    scheduler = session.runtime._scheduler
    step = scheduler.step

    def poisoned(frame_inputs):
        if any(np.all(item.arrays["image/base_0_rgb"] == 7) for item in frame_inputs):
            raise RuntimeError("device fault")
        return step(frame_inputs)

    monkeypatch.setattr(scheduler, "step", poisoned)
    poison = raw_observation() | {"observation/image": np.full((224, 224, 3), 7, np.uint8)}
    good, failed = session.step([healthy(noise), RobotRequest("poison", poison)])
    np.testing.assert_array_equal(good["actions"], healthy_actions)
    assert isinstance(failed, RuntimeError)
    assert not _groups(session, "poison")
    assert scheduler.manager.active <= 1  # the healthy robot's request only


KEYS = ["observation/image", "observation/wrist_image", "observation/state", "prompt", "actions", "extra"]
junk = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20)
    | hnp.arrays(
        st.sampled_from([np.uint8, np.uint16, np.int64, np.float16, np.float32, np.float64, np.bool_]),
        st.sampled_from([(), (3,), (8,), (224, 224), (224, 224, 3), (3, 224, 224), (2, 8)]),
    ),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)
options = st.fixed_dictionaries(
    {},
    optional={
        "temperature": st.floats(),
        "top_p": st.floats(),
        "max_text_tokens": st.integers(-3, 2 * MAX_TEXT_TOKENS),
    },
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(KEYS), value=junk, request_options=options)
def test_fuzzed_requests_never_change_a_healthy_robots_reply(
    session, noise, healthy_actions, key, value, request_options
):
    """Random malformed observations next to a healthy robot: the attacker gets a one-line error or a
    normal reply; the healthy robot's actions equal its reference (bit for bit when it is alone in the
    frame, to float32 rounding in a batch of two) and its text advances one token per frame."""
    attacker = RobotRequest("fuzzer", raw_observation() | {key: value}, RequestOptions(**request_options))
    before = _groups(session, "healthy")
    speech = before[0].requests[0] if before else None
    previous = 0 if speech is None or speech.result is not None else len(speech.tokens)
    good, other = session.step([healthy(noise), attacker])
    if isinstance(other, Exception):
        assert isinstance(other, ValueError) and "\n" not in str(other)
        np.testing.assert_array_equal(good["actions"], healthy_actions)
    else:
        assert other["actions"].shape == (10, 7)
        np.testing.assert_allclose(good["actions"], healthy_actions, atol=1e-5, rtol=0)
    assert len(good["text_tokens"]) == previous + 1


def test_a_prompt_cut_to_the_token_budget_is_warned_about_once_per_robot(caplog):
    """With the discrete state in the prompt, a task of 40 tokens fits alone and is cut with the state,
    as openpi does, with a warning: each robot sends it three times and gets one warning, not three."""
    policy = copy.copy(make_policy("dsi1", "float32"))
    policy.engine = FakeEngine(policy.engine.config)
    session = Robots(policy, RuntimeConfig(max_slots=0, max_new_tokens=0, max_prefill_batch=2))
    caplog.set_level(logging.WARNING, "oxygen_jax.tokenizer")
    long_prompt = raw_observation() | {"prompt": "bowl " * 40}
    try:
        for _ in range(3):
            requests = [RobotRequest(robot, long_prompt) for robot in "xy"]
            assert all(isinstance(reply, dict) for reply in session.step(requests))
    finally:
        session.stop()
    warnings = [record.getMessage() for record in caplog.records if record.name == "oxygen_jax.tokenizer"]
    assert len(warnings) == 2 and all("truncating" in warning for warning in warnings)
    assert {warning.rsplit("(", 1)[1] for warning in warnings} == {
        "robot robot-0; once per robot)",
        "robot robot-1; once per robot)",
    }
