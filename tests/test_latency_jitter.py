"""Latencies that wander (`client/latency.py`) in the simulated loop, and a robot whose delay estimate
is wrong: each step is still executed once, a late reply switching where the executor's rules say."""

import json

import numpy as np
import pytest
from test_rtc_alignment import HZ, E, H, StampRobot, StampServer

from oxygen_jax.client import MODES, latency, protocol, simulated
from oxygen_jax.client.executor import Executor, ExecutorConfig, SimClock
from oxygen_jax.errors import InvalidArgumentError

D = 4
DRAWS = 40_000


def _draws(jitter: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.array([latency.draw(jitter, D, rng) for _ in range(DRAWS)])


def test_no_jitter_is_the_nominal_delay():
    assert set(_draws("none")) == {float(D)}


def test_uniform_jitter_spreads_half_the_delay_either_way():
    draws = _draws("uniform")
    assert draws.min() >= D / 2 and draws.max() <= 1.5 * D
    np.testing.assert_allclose(np.quantile(draws, [0.25, 0.5, 0.75]), [0.75 * D, D, 1.25 * D], rtol=0.02)


def test_heavy_tail_has_mean_d_a_floor_and_rare_very_late_replies():
    """Pareto of shape 3 scaled to mean d: never below 2d/3; P(> 2d) = (1/3)^3, P(> 3d) = (2/9)^3."""
    draws = _draws("heavy_tail")
    assert draws.min() >= 2 * D / 3
    np.testing.assert_allclose(draws.mean(), D, rtol=0.03)
    np.testing.assert_allclose((draws > 2 * D).mean(), (1 / 3) ** 3, atol=0.004)
    np.testing.assert_allclose((draws > 3 * D).mean(), (2 / 9) ** 3, atol=0.002)
    assert draws.max() > 4 * D


def test_the_settings_refuse_an_unknown_jitter_and_an_estimate_beyond_the_chunk():
    latency.LatencySettings("heavy_tail", 0).check(H)
    with pytest.raises(InvalidArgumentError, match="latency_jitter must be one of none, uniform, heavy_tail"):
        latency.LatencySettings("gauss").check(H)
    with pytest.raises(InvalidArgumentError, match=r"delay_estimate must lie in \[0, 9\], got 10"):
        latency.LatencySettings(delay_estimate=10).check(H)


def test_fresh_delay_is_the_nominal_of_requests_that_continue_no_chunk():
    continuing = {protocol.RTC: protocol.rtc_request(executed=3, delay=2, horizon=4, chunk_id=1)}
    assert latency.LatencySettings(fresh_delay=7.5).nominal({}, D) == 7.5
    assert latency.LatencySettings(fresh_delay=7.5).nominal(continuing, D) == D
    assert latency.LatencySettings().nominal({}, D) == D
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(InvalidArgumentError, match="fresh_delay must be finite and >= 0"):
            latency.LatencySettings(fresh_delay=bad).check(H)


def _served_results(tmp_path, continuing: dict[str, int], fresh: dict[str, int]):
    path = tmp_path / "results.json"
    path.write_text(
        json.dumps({"latency_ticks_histogram": continuing, "fresh_latency_ticks_histogram": fresh})
    )
    return path


def test_served_latencies_replay_a_served_runs_ticks_fresh_requests_apart(tmp_path):
    """`--latency_jitter=served`: a request that continues a chunk draws from the served run's ticks of
    such requests, a fresh one from the fresh requests' ticks, each in proportion to its count."""
    served = latency.ServedLatencies.load(_served_results(tmp_path, {"2": 1, "3": 3}, {"7": 1}))
    settings = latency.LatencySettings("served", served=served)
    settings.check(H)
    draw = settings.drawer(D, np.random.default_rng(0))
    continuing = {protocol.RTC: protocol.rtc_request(executed=3, delay=2, horizon=4, chunk_id=1)}
    draws = np.array([draw(continuing) for _ in range(4000)])
    assert set(draws) == {2.0, 3.0}
    np.testing.assert_allclose((draws == 3.0).mean(), 0.75, atol=0.03)
    assert {draw({}) for _ in range(50)} == {7.0}
    assert settings.fields()["latencies_from"] == str(tmp_path / "results.json")


def test_served_latencies_refuse_what_is_not_a_served_run(tmp_path):
    (tmp_path / "simulated.json").write_text(json.dumps({"success_rate": 1.0}))
    with pytest.raises(InvalidArgumentError, match=r"not the results\.json of a served run"):
        latency.ServedLatencies.load(tmp_path / "simulated.json")
    with pytest.raises(InvalidArgumentError, match="measured no latency"):
        latency.ServedLatencies.load(_served_results(tmp_path, {}, {}))
    with pytest.raises(InvalidArgumentError, match="go together"):
        latency.LatencySettings("served").check(H)
    served = latency.ServedLatencies.load(_served_results(tmp_path, {"3": 1}, {}))
    assert served.fresh == {3: 1}  # a run without fresh requests replays its others for them
    with pytest.raises(InvalidArgumentError, match="no fresh_delay"):
        latency.LatencySettings("served", fresh_delay=7.0, served=served).check(H)


@pytest.mark.parametrize("jitter", ["none", "uniform", "heavy_tail"])
def test_the_executor_counts_each_replys_latency_in_ticks(jitter):
    """What a served run's histograms count: the ticks from a request to the tick that takes its reply,
    the first tick after its latency."""
    robot, rng, drawn = StampRobot(), np.random.default_rng(1), []

    def latency_steps(_: dict) -> float:
        drawn.append(latency.draw(jitter, D, rng))
        return drawn[-1]

    clock = SimClock()
    config = ExecutorConfig(control_hz=HZ, execution_horizon=E, mode="rtc", delay_steps=D)
    requests = simulated.DelayedRequests(StampServer(), clock, D, HZ, latency_steps)
    executor = Executor(config, robot, requests=requests, clock=clock)
    executor.run(100)
    ticks = executor.stats.latency_ticks
    assert len(ticks) >= 10
    np.testing.assert_array_equal(ticks, np.ceil(np.array(drawn[: len(ticks)]) - 1e-9))


def _stalls(execution: str, fresh_delay: float | None) -> tuple[int, StampRobot]:
    """Ticks without an action in 60 ticks of the stamp robot, fresh requests taking `fresh_delay`."""
    robot = StampRobot()
    motion = simulated.run(
        robot,
        StampServer(),
        execution=execution,
        delay_steps=D,
        execution_horizon=E,
        control_hz=HZ,
        max_ticks=60,
        latency_steps=latency.LatencySettings(fresh_delay=fresh_delay).drawer(D, np.random.default_rng(0)),
    )
    return motion.ticks - len(robot.executed), robot


@pytest.mark.parametrize("execution", MODES)
def test_a_request_that_continues_no_chunk_takes_the_fresh_delay(execution):
    """rtc's first request continues no chunk (the robot waits 7 ticks for it, not d = 4; its later ones
    arrive within the chunk, d < E); every sync and naive request is such a one, so they stall longer."""
    stalls, robot = _stalls(execution, 7.0)
    assert robot.executed == list(range(len(robot.executed)))
    if execution == "rtc":
        assert (stalls, _stalls(execution, None)[0]) == (7, D)
    else:
        assert stalls > _stalls(execution, None)[0]


def _run(execution: str, jitter: str, estimate: int | None, seed: int = 0):
    robot, server = StampRobot(), StampServer()
    rng = np.random.default_rng(seed)
    latencies: list[float] = []

    def latency_steps(_: dict) -> float:
        latencies.append(latency.draw(jitter, D, rng))
        return latencies[-1]

    simulated.run(
        robot,
        server,
        execution=execution,
        delay_steps=D,
        execution_horizon=E,
        control_hz=HZ,
        max_ticks=200,
        latency_steps=latency_steps,
        delay_estimate=estimate,
    )
    return robot, server, np.array(latencies)


@pytest.mark.parametrize("jitter", ["uniform", "heavy_tail"])
@pytest.mark.parametrize("estimate", [None, 1, 5])
@pytest.mark.parametrize("execution", [*MODES, "bid"])
def test_late_and_early_replies_execute_each_step_once(execution, jitter, estimate):
    """The stamp model's action i is for control step n + i. A reply later than the robot's estimate d
    finds e > d actions executed and switches at index e; an earlier one waits for index d; one later than
    the actions left stalls the robot. Either way no step is skipped or run twice."""
    robot, server, latencies = _run(execution, jitter, estimate)
    assert robot.executed == list(range(len(robot.executed)))
    assert len(robot.executed) >= 60
    sent = estimate if estimate is not None else D
    assert (latencies > sent).any()  # some replies came later than the robot expected
    if execution in ("rtc", "bid"):
        assert server.guided and {g.delay for _, g in server.guided} <= set(range(sent + 1))
        assert max(g.delay for _, g in server.guided) == sent  # clamped only to the actions left
