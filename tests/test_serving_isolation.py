"""One robot's bad input never reaches another: each request is checked and canonicalized on its own."""

import numpy as np
import pytest
from test_policy import make_policy, raw_observation

from oxygen_jax.runtime.k_policy import FixedK
from oxygen_jax.runtime.session import MultiRobotSession, RobotRequest

pytestmark = pytest.mark.timeout(120)

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
    session = MultiRobotSession(policy, FixedK(1), max_slots=4, max_batch=4)
    session.warmup(raw_observation())
    return session


@pytest.fixture(scope="module")
def noise() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((10, 32)).astype(np.float32)


@pytest.fixture(scope="module")
def healthy_actions(policy, noise) -> np.ndarray:
    return policy.infer(raw_observation(), noise=noise, prompt_for_text=False)["actions"]


def healthy(noise: np.ndarray) -> RobotRequest:
    return RobotRequest("healthy", raw_observation(), noise=noise)


@pytest.mark.parametrize("case", list(BAD_INPUTS) + list(BAD_OPTIONS))
def test_a_bad_request_gets_its_own_error_and_the_frame_goes_on(session, noise, healthy_actions, case):
    bad, named = BAD_INPUTS[case] if case in BAD_INPUTS else BAD_OPTIONS[case]
    if case in BAD_INPUTS:
        attacker = RobotRequest("attacker", raw_observation() | bad)
    else:
        attacker = RobotRequest("attacker", raw_observation(), **bad)
    good, refused = session.step([healthy(noise), attacker])
    assert isinstance(refused, ValueError) and named in str(refused)
    assert "\n" not in str(refused)
    np.testing.assert_array_equal(good["actions"], healthy_actions)


def test_an_extra_actions_key_is_ignored_and_harms_no_one(session, noise, healthy_actions):
    attacker = RobotRequest("attacker", raw_observation() | {"actions": np.zeros((10, 7))}, noise=noise)
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
    assert "refused" not in session._speech


def test_a_failing_model_call_is_retried_row_by_row(session, noise, healthy_actions, monkeypatch):
    """A frame whose model call fails is retried one request at a time: only the one that fails again
    gets the error, and no language request it started is left behind."""
    scheduler = session._scheduler
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
    assert "poison" not in session._speech
    assert scheduler.manager.active <= 1  # the healthy robot's request only
