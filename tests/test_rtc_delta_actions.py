"""Real-time chunking for delta-action robots: the guidance target is the previous chunk as the robot
executes it, expressed in the new request's model space with the new state (`policies/executed_chunk.py`).

ALOHA (openpi's pi05_aloha: joint deltas from the state, absolute grippers) and ALOHA sim (absolute
joints), with non-trivial quantile norm stats, on the fake engine (tests/fake_engine.py): no model runs,
what is checked is the target the engine is given, and through the fake guidance (a guided row's first
`delay` actions are its target's) what reaches the robot.
"""

import copy

import numpy as np
import pytest
from conftest import TOKENIZER
from fake_engine import FakeEngine

from oxygen_jax.client import protocol
from oxygen_jax.policies import aloha
from oxygen_jax.policies.normalization import NormStats
from oxygen_jax.policies.policy import create_policy
from oxygen_jax.policies.request_options import RequestOptions
from oxygen_jax.robots.chunks import RobotChunks, align
from oxygen_jax.robots.local import LocalRobot
from oxygen_jax.robots.robot import RobotRequest
from oxygen_jax.robots.robots import Robots
from oxygen_jax.runtime.runtime import RuntimeConfig

H = 10
RTC = {"executed": 3, "delay": 2, "horizon": 6}
JOINTS = np.asarray(aloha.DELTA_ACTION_MASK)


def _quantile_stats(rng: np.random.Generator, scale: float) -> NormStats:
    q01, q99 = rng.uniform(-2.0, -0.5, 14) * scale, rng.uniform(0.5, 2.0, 14) * scale
    return NormStats(mean=(q01 + q99) / 2, std=(q99 - q01) / 4, q01=q01, q99=q99)


def _policy(robot: str):
    rng = np.random.default_rng(0)
    norm_stats = {"state": _quantile_stats(rng, 1.0), "actions": _quantile_stats(rng, 0.5)}
    policy = copy.copy(
        create_policy(
            "pi05_tiny", None, tokenizer_path=TOKENIZER, norm_stats=norm_stats, overrides={"robot": robot}
        )
    )
    policy.engine = FakeEngine(policy.engine.config)
    return policy


@pytest.fixture(scope="module")
def delta_policy():
    return _policy("aloha")


@pytest.fixture(scope="module")
def absolute_policy():
    return _policy("aloha_sim")


def _observation(seed: int) -> dict:
    """An ALOHA observation: joints in [-1, 1], grippers' normalized openings in [0.2, 0.8]."""
    rng = np.random.default_rng(seed)
    state = rng.uniform(-1.0, 1.0, 14)
    state[aloha.GRIPPER_DIMS] = rng.uniform(0.2, 0.8, 2)
    image = rng.integers(0, 256, (3, 48, 64), dtype=np.uint8)
    return {"images": {"cam_high": image}, "state": state, "prompt": "transfer the cube"}


def _noise(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((H, 32)).astype(np.float32)


def _targets(policy, old_obs: dict, new_obs: dict):
    """A first chunk (model space) answered for `old_obs`, the robot actions it became, and the guidance a
    request from `new_obs` with RTC gets: (old chunk, its robot actions, the planned-space guidance,
    the guidance prepared for the new request, the new request)."""
    chunks = RobotChunks()
    old_chunk = _noise(1) * 2
    actions = policy.finish(policy.prepare(old_obs), old_chunk)["actions"]
    chunks.answered(chunks.arrive(), old_chunk, actions, 0.0)
    guidance, start = chunks.guidance(RTC, H)
    assert start == RTC["delay"]
    prepared = policy.prepare(new_obs, RequestOptions(guidance=guidance))
    return old_chunk, actions, guidance.planned, prepared.guidance, prepared


def test_an_absolute_robot_is_guided_towards_the_old_model_chunk_as_before(absolute_policy):
    """ALOHA sim's actions involve no state: the new target is the aligned old model chunk, the target
    before delta robots were handled, to float rounding on the robot's 14 dims and exactly past them."""
    old_chunk, _, planned, guidance, _ = _targets(absolute_policy, _observation(0), _observation(1))
    np.testing.assert_array_equal(planned.prev_chunk, align(old_chunk, RTC["executed"]))
    np.testing.assert_allclose(guidance.prev_chunk, planned.prev_chunk, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(guidance.prev_chunk[:, 14:], planned.prev_chunk[:, 14:])
    assert (guidance.delay, guidance.horizon) == (RTC["delay"], RTC["horizon"])
    assert guidance.schedule == planned.schedule
    assert guidance.max_guidance_weight == planned.max_guidance_weight


def test_a_delta_robots_target_taken_back_with_the_new_state_is_what_the_robot_executes(delta_policy):
    """pi05_aloha's joints are deltas: the new target, through the output transforms with the new state,
    gives back the old chunk's actions (aligned) at every index, the overlap [0, s) included. The old
    chunk's model-space target would be off by the state's change on the 12 joints (the defect fixed)."""
    old_obs, new_obs = _observation(0), _observation(1)
    _, actions, planned, guidance, prepared = _targets(delta_policy, old_obs, new_obs)
    executed = align(actions, RTC["executed"])
    back = delta_policy.io.outputs(prepared.state, guidance.prev_chunk)["actions"]
    np.testing.assert_allclose(back, executed, rtol=0, atol=1e-6)
    stale_back = delta_policy.io.outputs(prepared.state, planned.prev_chunk)["actions"]
    change = np.where(JOINTS, new_obs["state"] - old_obs["state"], 0.0)
    np.testing.assert_allclose(stale_back - executed, np.broadcast_to(change, executed.shape), atol=1e-5)
    assert np.abs(change).max() > 0.1
    # The model's padding dims carry no state: they keep the old chunk's values.
    np.testing.assert_array_equal(guidance.prev_chunk[:, 14:], planned.prev_chunk[:, 14:])


def test_rtc_policy_freezes_the_executed_actions_of_a_delta_robot(delta_policy):
    """Through `LocalRobot`: the fake engine freezes the first `delay` actions to the target, so the reply
    starts with exactly what the robot executes there from the old chunk, from a new state."""
    rtc_policy = LocalRobot(delta_policy)
    first = rtc_policy.infer(_observation(0), noise=_noise(2))
    request = {**RTC, protocol.CHUNK_ID: first[protocol.CHUNK_ID]}
    reply = rtc_policy.infer({**_observation(1), protocol.RTC: request}, noise=_noise(3))
    executed = align(first["actions"], RTC["executed"])
    np.testing.assert_allclose(reply["actions"][: RTC["delay"]], executed[: RTC["delay"]], rtol=0, atol=1e-6)
    assert np.abs(reply["actions"][RTC["delay"] :] - executed[RTC["delay"] :]).max() > 0.1  # not frozen


def test_the_session_guides_a_delta_robot_towards_what_it_executes(delta_policy):
    """The same through the multi-robot session, whose robots keep their reply's actions."""
    config = RuntimeConfig(max_slots=0, max_new_tokens=0, max_prefill_batch=2)
    session = Robots(delta_policy, config)
    try:
        [first] = session.step([RobotRequest("a", _observation(0), RequestOptions(noise=_noise(2)))])
        [reply] = session.step(
            [RobotRequest("a", _observation(1), RequestOptions(noise=_noise(3)), rtc={**RTC, "chunk_id": 0})]
        )
    finally:
        session.stop()
    executed = align(first["actions"], RTC["executed"])
    np.testing.assert_allclose(reply["actions"][: RTC["delay"]], executed[: RTC["delay"]], rtol=0, atol=1e-6)
    assert reply[protocol.START] == RTC["delay"]
