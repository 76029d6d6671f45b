"""The server side of the `rtc` protocol on a local Policy (golden tiny model, LIBERO I/O)."""

import threading
import time

import numpy as np
import pytest
from conftest import E2E, FakePending, GoldenRobot, make_policy, raw_observation

from oxygen_jax.client import Executor, ExecutorConfig, SimClock, protocol
from oxygen_jax.engine.api import ChunkGuidance
from oxygen_jax.errors import UserError
from oxygen_jax.models import inputs
from oxygen_jax.policies import chunk_choice
from oxygen_jax.policies.request_options import RequestOptions
from oxygen_jax.robots.chunks import RtcError, align
from oxygen_jax.robots.local import LocalRobot
from oxygen_jax.robots.trial import GuidanceSettings, draw_noise, seeded_infer

NOISE = E2E["in/noise"]


@pytest.fixture(scope="module")
def policy():
    return make_policy("dsi0", "float32")


def _model_actions(policy, obs: dict, guidance: ChunkGuidance | None) -> np.ndarray:
    """The model-space chunk Policy.infer would compute for `obs` and NOISE, guided as given."""
    arrays = policy.model_inputs(obs)
    observation = inputs.observation_from_arrays(
        {k: np.asarray(v)[None] for k, v in arrays.items()}, policy.engine.config
    )
    cache = policy.engine.prefill(observation)
    noise = NOISE[None] if NOISE.ndim == 2 else NOISE
    return np.asarray(policy.engine.denoise(cache, noise, policy.num_steps, [guidance])[0])


def test_align_shifts_by_the_executed_actions_and_repeats_the_last():
    chunk = np.arange(5.0)[:, None]
    np.testing.assert_array_equal(align(chunk, 2)[:, 0], [2, 3, 4, 4, 4])
    np.testing.assert_array_equal(align(chunk, 0), chunk)
    np.testing.assert_array_equal(align(chunk, 5)[:, 0], [4] * 5)


def test_closed_loop_noise_on_the_leading_dims_only_keeps_their_draw():
    """noise_dims=2: the first two dims are the full draw's (same seed), every later dim is 0."""
    full = draw_noise(np.random.default_rng(7), (10, 32), None)
    kept = draw_noise(np.random.default_rng(7), (10, 32), 2)
    np.testing.assert_array_equal(kept[:, :2], full[:, :2])
    assert not kept[:, 2:].any() and full[:, 2:].std() > 0.5


def test_closed_loop_settings_the_model_can_run_pass_the_check(policy):
    model = policy.engine.config  # H = 10, 32 action dims
    GuidanceSettings().check(model, execution="sync", delays=[0, 7, 9], execution_horizon=6)  # sync waits
    GuidanceSettings(noise_dims=32).check(model, execution="rtc", delays=[0, 6], execution_horizon=6)


@pytest.mark.parametrize(
    ("settings", "execution", "delays", "message"),
    [
        (GuidanceSettings(), "sync", [0, 10], r"delay_steps must lie in \[0, 9\], got 10"),
        (GuidanceSettings(), "rtc", [2, 7], "delay_steps 7 exceeds execution_horizon 6"),
        (GuidanceSettings(noise_dims=33), "rtc", [2], r"noise_dims must lie in \[1, 32\]"),
        (GuidanceSettings(fresh_samples=0), "rtc", [2], r"fresh_samples must lie in \[1, 64\], got 0"),
    ],
)
def test_closed_loop_settings_the_model_cannot_run_are_one_line_user_errors(
    policy, settings, execution, delays, message
):
    with pytest.raises(UserError, match=message) as error:
        settings.check(policy.engine.config, execution=execution, delays=delays, execution_horizon=6)
    assert isinstance(error.value, ValueError) and "\n" not in str(error.value)


def test_a_client_without_rtc_gets_the_plain_reply_plus_chunk_fields(policy):
    rtc_policy = LocalRobot(policy)
    reply = rtc_policy.infer(raw_observation(), noise=NOISE)
    plain = policy.infer(raw_observation(), noise=NOISE)
    np.testing.assert_array_equal(reply["actions"], plain["actions"])
    assert (reply[protocol.CHUNK_ID], reply[protocol.START], reply[protocol.STALE]) == (0, 0, False)
    assert rtc_policy.infer(raw_observation(), noise=NOISE)[protocol.CHUNK_ID] == 1


def test_rtc_request_is_guided_towards_the_aligned_last_chunk(policy):
    rtc_policy = LocalRobot(policy)
    obs = raw_observation()
    rtc_policy.infer(obs, noise=NOISE)
    first = _model_actions(policy, obs, None)
    request = {"executed": 3, "delay": 2, "horizon": 6, protocol.CHUNK_ID: 0}
    reply = rtc_policy.infer({**obs, protocol.RTC: request}, noise=NOISE)
    want = _model_actions(policy, obs, ChunkGuidance(align(first, 3), 2, 6))
    robot_actions = policy.finish(policy.prepare(obs, RequestOptions(noise=NOISE)), want)["actions"]
    np.testing.assert_allclose(reply["actions"], robot_actions, rtol=0, atol=1e-6)
    assert (reply[protocol.CHUNK_ID], reply[protocol.START], reply[protocol.STALE]) == (1, 2, False)
    # The two frozen actions follow what the robot executes from the first chunk (indices 3 and 4).
    plain = _model_actions(policy, obs, None)
    assert np.abs(want[:2] - first[3:5]).mean() < 0.5 * np.abs(plain[:2] - first[3:5]).mean()


def test_delay_is_estimated_from_the_servers_latency_and_the_robots_control_hz(policy):
    rtc_policy = LocalRobot(policy)
    rtc_policy.infer(raw_observation(), noise=NOISE)
    reply = rtc_policy.infer({**raw_observation(), protocol.RTC: {"executed": 4, "control_hz": 1e-3}})
    assert reply[protocol.START] == 1  # any latency under 1000 s is one step at 1 mHz


@pytest.mark.parametrize(
    ("rtc", "message"),
    [
        ({"executed": -1, "delay": 2, "horizon": 5}, "rtc.executed must be >= 0"),
        ({"executed": 3, "delay": 10, "horizon": 10}, "rtc.delay 10 must be < the action horizon 10"),
        ({"executed": 3, "delay": 4, "horizon": 2}, r"rtc.horizon 2 must lie in \[delay=4, 10\]"),
        ({"executed": 11, "delay": 2, "horizon": 5}, "rtc.executed 11 is beyond the last chunk's 10 actions"),
        ({"executed": 3, "delay": 2.5, "horizon": 5}, "rtc.delay must be an int"),
        (
            {"executed": 3, "delay": 2, "horizon": 5, "chunk_id": 7},
            r"rtc.chunk_id 7 is not the last chunk sent \(0\)",
        ),
        ({"executed": 3, "horizon": 5}, "rtc.delay is missing and the robot's control_hz is unknown"),
        ([3, 2, 5], "rtc must be a dict"),
    ],
)
def test_bad_rtc_values_are_one_line_errors_that_leave_the_robot_as_it_was(policy, rtc, message):
    rtc_policy = LocalRobot(policy)
    rtc_policy.infer(raw_observation(), noise=NOISE)
    with pytest.raises(RtcError, match=message) as error:
        rtc_policy.infer({**raw_observation(), protocol.RTC: rtc}, noise=NOISE)
    assert "\n" not in str(error.value)
    good = {"executed": 3, "delay": 2, "horizon": 6, protocol.CHUNK_ID: 0}
    assert rtc_policy.infer({**raw_observation(), protocol.RTC: good}, noise=NOISE)[protocol.CHUNK_ID] == 1


def test_rtc_without_a_previous_chunk_is_an_error(policy):
    with pytest.raises(RtcError, match="needs a previous chunk"):
        LocalRobot(policy).infer(
            {**raw_observation(), protocol.RTC: {"executed": 0, "delay": 1, "horizon": 4}}
        )


def test_a_reply_overtaken_by_a_newer_request_is_marked_stale(policy):
    """Two requests of one robot: both arrive while the policy is busy (its lock held here), so the first
    one's reply is computed after the second arrived, whichever runs first."""
    rtc_policy = LocalRobot(policy)
    replies = {}

    def request(name: str) -> threading.Thread:
        thread = threading.Thread(target=lambda: replies.update({name: rtc_policy.infer(raw_observation())}))
        thread.start()
        return thread

    with rtc_policy._lock:
        threads = [request("first")]
        _wait_for(lambda: rtc_policy.chunks.latest == 0)
        threads.append(request("second"))
        _wait_for(lambda: rtc_policy.chunks.latest == 1)
    for thread in threads:
        thread.join(timeout=60)
    assert replies["first"][protocol.STALE] is True
    assert replies["second"][protocol.STALE] is False


def _wait_for(condition) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.001)


class _LocalServer:
    """LocalRobot.infer computed at once, its reply due `latency_s` later on the fake clock."""

    def __init__(self, rtc_policy: LocalRobot, clock: SimClock, latency_s: float):
        self.rtc_policy, self.clock, self.latency_s = rtc_policy, clock, latency_s
        self.requests: list[dict] = []

    def submit(self, obs: dict) -> FakePending:
        self.requests.append(obs.get(protocol.RTC))
        reply = self.rtc_policy.infer(obs, noise=NOISE)
        return FakePending(self.clock, self.clock.now() + self.latency_s, reply)


def _drive(policy, mode: str) -> tuple:
    clock = SimClock()
    server = _LocalServer(LocalRobot(policy), clock, latency_s=0.25)
    robot = GoldenRobot()
    config = ExecutorConfig(control_hz=10.0, execution_horizon=4, mode=mode)
    stats = Executor(config, robot, requests=server, clock=clock).run(24)
    assert [s.chunk_id for s in stats.switches] == list(range(len(stats.switches)))
    assert len(stats.switches) >= 3 and stats.stale_replies == 0
    assert len(robot.executed) == stats.actions and robot.executed[0].shape == (7,)
    return stats, server


def test_the_executor_drives_a_local_rtc_policy_and_rtc_softens_the_switches(policy):
    """The client's requests are what the server accepts: chunk ids follow each other; with rtc each
    switch happens at the start the server gave (the measured latency, 3 ticks) and the new chunk's first
    action is nearer the old chunk's than in naive switching (same observations and noise)."""
    naive, naive_server = _drive(policy, "naive")
    rtc, rtc_server = _drive(policy, "rtc")
    assert naive_server.requests[1:] == [None] * (len(naive_server.requests) - 1)
    assert rtc_server.requests[1] == {"executed": 6, "delay": 3, "horizon": 4, protocol.CHUNK_ID: 0}
    assert [s.start for s in rtc.switches[1:]] == [3] * (len(rtc.switches) - 1)
    naive_jump = np.mean([s.jump for s in naive.switches[1:]])
    rtc_jump = np.mean([s.jump for s in rtc.switches[1:]])
    assert rtc_jump < 0.5 * naive_jump, (rtc_jump, naive_jump)


def test_fresh_samples_draw_several_chunks_for_a_request_without_rtc_only(policy):
    """The first request's reply is the densest of its samples' chunks, each as Policy.infer computes it
    alone with that noise; a request with `rtc` draws one chunk, so it takes one noise, not several."""
    noises = np.stack([NOISE, *draw_noise(np.random.default_rng(3), (4, *NOISE.shape), None)])
    rtc_policy = LocalRobot(policy, fresh_samples=5)
    first = rtc_policy.infer(raw_observation(), noise=noises)
    alone = np.stack([policy.infer(raw_observation(), noise=n)["actions"] for n in noises])
    np.testing.assert_allclose(first["actions"], alone[chunk_choice.densest(alone)], atol=1e-5)
    assert first[protocol.CHUNK_ID] == 0
    continued = {**raw_observation(), protocol.RTC: {"executed": 2, "delay": 1}}
    with pytest.raises(UserError, match=r"'noise': expected shape \[1, 10, 32\]"):
        rtc_policy.infer(continued, noise=noises)
    assert rtc_policy.infer(continued, noise=NOISE)[protocol.CHUNK_ID] == 1


def test_closed_loop_fresh_samples_leave_the_other_requests_noise_as_it_was(policy):
    """seeded_infer draws the extra samples from a spawned stream: the rtc requests after the first get
    the same noise with fresh_samples 1 and 4, so runs differ only where the first chunk does."""
    replies = {}
    for samples in (1, 4):
        infer = seeded_infer(policy, GuidanceSettings(fresh_samples=samples), np.random.default_rng(11))
        infer(raw_observation())
        continued = {**raw_observation(), protocol.RTC: {"executed": 10, "delay": 0}}
        replies[samples] = infer(continued)["actions"]  # past the old chunk's end: no guidance left
    np.testing.assert_allclose(replies[1], replies[4], atol=1e-6)
