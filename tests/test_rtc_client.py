"""The robot-side executor on a fake clock: which chunk index runs at which tick, in each mode.

The fake server answers after a fixed latency on the fake clock; chunk k's action j is the number
1000 k + j, so the executed sequence shows exactly which chunk and index ran at every tick. With `rtc`
the fake server guides perfectly: the new chunk repeats the old chunk's aligned actions up to `horizon`.
"""

import subprocess
import sys

import numpy as np
import pytest
from conftest import FakePending

from oxygen_jax.client import Executor, ExecutorConfig, SimClock, protocol

H = 10
HZ = 10.0  # one tick every 0.1 s


class FakeServer:
    def __init__(self, clock: SimClock, latency_s: float, stale_every: int = 0, first_latency_s=None):
        self.clock, self.latency_s, self.stale_every = clock, latency_s, stale_every
        self.first_latency_s = latency_s if first_latency_s is None else first_latency_s
        self.observations: list[dict] = []
        self.sent: list[np.ndarray] = []

    def submit(self, obs: dict) -> FakePending:
        self.observations.append(obs)
        chunk_id = len(self.sent)
        actions = 1000.0 * chunk_id + np.arange(H, dtype=np.float64)[:, None]
        start = 0
        if protocol.RTC in obs:
            rtc = obs[protocol.RTC]
            assert rtc[protocol.CHUNK_ID] == chunk_id - 1
            aligned = self.sent[-1][rtc["executed"] :]
            actions[: rtc["horizon"]] = aligned[: rtc["horizon"]]
            start = rtc["delay"]
        self.sent.append(actions)
        stale = bool(self.stale_every) and chunk_id % self.stale_every == self.stale_every - 1
        reply = {
            "actions": actions,
            protocol.CHUNK_ID: chunk_id,
            protocol.START: start,
            protocol.STALE: stale,
        }
        latency = self.first_latency_s if chunk_id == 0 else self.latency_s
        return FakePending(self.clock, self.clock.now() + latency, reply)


class FakeRobot:
    def __init__(self):
        self.executed: list[float] = []

    def observe(self) -> dict:
        return {"state": np.array([len(self.executed)], np.float32)}

    def act(self, action: np.ndarray) -> None:
        self.executed.append(float(action[0]))


def _run(mode: str, ticks: int, latency_s: float = 0.25, execution_horizon: int = 4, **config):
    clock = SimClock()
    server = FakeServer(clock, latency_s, config.pop("stale_every", 0), config.pop("first_latency_s", None))
    robot = FakeRobot()
    executor_config = ExecutorConfig(HZ, execution_horizon, mode, **config)
    stats = Executor(executor_config, robot, requests=server, clock=clock).run(ticks)
    return stats, robot, server, clock


def test_sync_stops_for_every_reply_and_starts_each_chunk_at_zero():
    stats, robot, server, clock = _run("sync", ticks=25, execution_horizon=2)
    # Each reply (0.25 s, polled each 0.1 s) is taken 3 ticks after its observation: 8 actions, then 3
    # stalled ticks per chunk; the third reply would come at tick 25.
    assert robot.executed == [*range(8), *range(1000, 1008)]
    assert stats.stalls == 3 + 3 + 3 and stats.actions == 16 and stats.ticks == 25
    assert [(s.chunk_id, s.start) for s in stats.switches] == [(0, 0), (1, 0)]
    assert stats.switches[1].jump == 1000 - 8  # against the old chunk's action for that moment
    assert all(protocol.RTC not in obs for obs in server.observations)
    assert clock.now() == pytest.approx(2.5)


def test_naive_keeps_moving_and_switches_at_the_aligned_index():
    """The request goes out before the 7th action (4 left); 3 ticks later the reply is there and the robot
    has executed 3 more, so it continues the new chunk at index 3: the same moment, another plan."""
    stats, robot, server, _ = _run("naive", ticks=14)
    assert robot.executed == [*range(9), 1003, 1004]
    assert stats.stalls == 3
    assert [(s.chunk_id, s.start) for s in stats.switches[1:]] == [(1, 3)]
    assert stats.switches[1].jump == pytest.approx(1003 - 9)
    assert all(protocol.RTC not in obs for obs in server.observations)


def test_rtc_sends_progress_and_delay_and_switches_without_a_jump():
    """The measured latency (0.3 s, three ticks) becomes delay 3: the robot keeps the old chunk up to
    index 3 of the new one, whose first actions the server guided onto the old chunk."""
    stats, robot, server, _ = _run("rtc", ticks=20)
    rtc = server.observations[1][protocol.RTC]
    assert rtc == {"executed": 6, "delay": 3, "horizon": 4, "chunk_id": 0}
    # Index 3 of chunk 1 is the old chunk's 9 (guided), then chunk 1's own actions follow.
    assert robot.executed[:12] == [*range(10), 1004, 1005]
    assert [(s.chunk_id, s.start) for s in stats.switches[1:3]] == [(1, 3), (2, 3)]
    assert [s.jump for s in stats.switches[1:]] == [0.0] * (len(stats.switches) - 1)
    assert stats.stalls == 3  # only the first chunk was waited for


def test_rtc_delay_leaves_out_the_first_replys_latency_once_others_are_measured():
    """A first reply slowed by compilation (1.0 s) sets the delay of the second request only."""
    _, _, server, _ = _run("rtc", ticks=40, first_latency_s=1.0)
    delays = [obs[protocol.RTC]["delay"] for obs in server.observations[1:]]
    assert delays[:3] == [4, 3, 3]  # 1.0 s is 10 steps, clamped to the 4 actions left; then 0.3 s


def test_rtc_delay_and_horizon_can_be_set():
    _, _, server, _ = _run("rtc", ticks=12, delay_steps=1, prefix_horizon=2)
    assert server.observations[1][protocol.RTC] == {"executed": 6, "delay": 1, "horizon": 2, "chunk_id": 0}


def test_a_late_reply_stalls_the_robot_and_starts_past_what_it_executed():
    """Latency 0.65 s (taken 7 ticks after the observation) with 4 actions left: the chunk runs out after
    4 more actions, the robot stalls 3 ticks, and the new chunk starts past the 4 actions executed since
    the observation."""
    stats, robot, _, _ = _run("naive", ticks=22, latency_s=0.65)
    assert robot.executed == [*range(10), 1004, 1005]
    assert stats.stalls == 7 + 3
    assert stats.switches[1].start == 4 and stats.switches[1].jump is None


def test_a_stale_reply_is_dropped_and_asked_again():
    stats, robot, server, _ = _run("naive", ticks=20, stale_every=2)
    assert stats.stale_replies >= 1
    assert all(s.chunk_id % 2 == 0 for s in stats.switches)
    assert all(int(a) // 1000 % 2 == 0 for a in robot.executed)
    assert len(server.observations) == stats.requests


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError, match="mode must be one of sync, naive, rtc"):
        ExecutorConfig(HZ, 4, "smooth")
    with pytest.raises(ValueError, match="control_hz must be > 0"):
        ExecutorConfig(0.0, 4)
    with pytest.raises(ValueError, match="exactly one of requests= and infer="):
        Executor(ExecutorConfig(HZ, 4), FakeRobot())


def test_the_client_imports_no_jax():
    code = "import sys, oxygen_jax.client; assert 'jax' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
