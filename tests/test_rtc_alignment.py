"""The robot's switch index and the server's alignment agree, on the closed loop's simulated clock.

A stamp model plans, from an observation taken after n actions, the chunk whose action i is n + i: the
number of the control step it is for. The server side is the real `RobotChunks` (`align`, `start`), the
loop the real `client.simulated.run` with its `DelayedRequests`. If the executor switched one index early
or late, or the server aligned the previous chunk off by one, the executed stamps would repeat or skip
and the guidance target would not be the steps the new chunk is for.
"""

import numpy as np
import pytest

from oxygen_jax.client import MODES, protocol, simulated
from oxygen_jax.engine.guidance import prefix_weights
from oxygen_jax.robots.chunks import RobotChunks

H = 10
HZ = 10.0
E = simulated.default_execution_horizon(H)


class StampRobot:
    def __init__(self):
        self.executed: list[float] = []

    def observe(self) -> dict:
        return {"n": len(self.executed)}

    def act(self, action: np.ndarray) -> None:
        self.executed.append(float(action[0]))

    def position(self) -> np.ndarray:
        return np.array([len(self.executed)], np.float64)

    @property
    def done(self) -> bool:
        return False


class StampServer:
    """`LocalRobot.infer` without a model: `RobotChunks` aligns the last chunk and says where the reply
    starts; the new chunk is the stamps. Keeps every guidance it was asked for, with the request's n."""

    def __init__(self):
        self.chunks = RobotChunks()
        self.guided: list[tuple[int, object]] = []

    def __call__(self, obs: dict) -> dict:
        arrival = self.chunks.arrive()
        guidance, start = self.chunks.guidance(obs.get(protocol.RTC), H)
        if guidance is not None:
            # The stamps are the model's chunk and the robot's actions alike: both are aligned the same way.
            np.testing.assert_array_equal(guidance.executed, guidance.planned.prev_chunk)
            self.guided.append((obs["n"], guidance.planned))
        chunk = np.repeat(obs["n"] + np.arange(H, dtype=np.float32)[:, None], 2, axis=1)
        return {"actions": chunk, protocol.START: start, **self.chunks.answered(arrival, chunk, chunk, 0.0)}


@pytest.mark.parametrize("delay", range(H // 2 + 1))
@pytest.mark.parametrize("execution", MODES)
def test_every_mode_executes_each_step_once_at_any_delay(execution, delay):
    robot, server = StampRobot(), StampServer()
    motion = simulated.run(
        robot,
        server,
        execution=execution,
        delay_steps=delay,
        execution_horizon=E,
        control_hz=HZ,
        max_ticks=80,
    )
    # The k-th action executed is the one planned for step k: no step skipped, none run twice.
    assert robot.executed == list(range(len(robot.executed)))
    assert len(robot.executed) >= 30  # sync waits d ticks per chunk
    if execution != "sync":  # only the first chunk is waited for, even at d = H/2
        assert motion.ticks - len(robot.executed) == delay
    # Old and new chunks agree on every step, so every measured switch is a jump of 0.
    assert motion.jumps and set(motion.jumps) == {0.0}
    assert bool(server.guided) == (execution == "rtc")


@pytest.mark.parametrize("delay", range(H // 2 + 1))
def test_rtc_guides_toward_the_steps_the_new_chunk_is_for(delay):
    """The aligned previous chunk is, up to the prefix horizon s, the old plan for the new chunk's steps;
    its weight-1 prefix is exactly the d actions executed while the chunk is inferred, and the first
    action executed from the new chunk (index d) is free to move (weight < 1)."""
    robot, server = StampRobot(), StampServer()
    simulated.run(
        robot, server, execution="rtc", delay_steps=delay, execution_horizon=E, control_hz=HZ, max_ticks=80
    )
    assert len(server.guided) >= 8
    for n, guidance in server.guided:
        s = guidance.horizon
        np.testing.assert_array_equal(guidance.prev_chunk[:s, 0], n + np.arange(s))
        assert guidance.delay == delay <= s
        weights = prefix_weights(guidance.delay, s, H, guidance.schedule)
        assert (weights[: guidance.delay] == 1).all()
        assert (weights[guidance.delay :] < 1).all()


def test_the_prefix_horizon_setting_reaches_the_server():
    robot, server = StampRobot(), StampServer()
    simulated.run(
        robot,
        server,
        execution="rtc",
        delay_steps=2,
        execution_horizon=E,
        control_hz=HZ,
        max_ticks=40,
        prefix_horizon=4,
    )
    assert server.guided and {g.horizon for _, g in server.guided} == {4}
