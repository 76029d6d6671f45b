"""Latencies that wander (`client/latency.py`) in the simulated loop, and a robot whose delay estimate
is wrong: each step is still executed once, a late reply switching where the executor's rules say."""

import numpy as np
import pytest
from test_rtc_alignment import HZ, E, H, StampRobot, StampServer

from oxygen_jax.client import MODES, latency, simulated
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


def _run(execution: str, jitter: str, estimate: int | None, seed: int = 0):
    robot, server = StampRobot(), StampServer()
    rng = np.random.default_rng(seed)
    latencies: list[float] = []

    def latency_steps() -> float:
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
