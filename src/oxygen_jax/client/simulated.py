"""A robot's control loop under simulated inference latency, for closed-loop evaluation of any simulated
robot (the detour table, ALOHA sim) with `Executor` unchanged.

Time is simulated, so results do not depend on the machine's speed: the policy computes while the clock
stands still, and its reply reaches the robot `delay_steps` control steps after the observation was taken.
Meanwhile the robot executes its old chunk (naive, rtc) or waits (sync).
"""

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from oxygen_jax.client.executor import MODES, Executor, ExecutorConfig, Robot, SimClock
from oxygen_jax.errors import InvalidArgumentError

# The executor's modes, and `bid`: the robot as in `rtc`, each chunk chosen by bidirectional decoding.
EXECUTIONS = (*MODES, "bid")


@dataclasses.dataclass(frozen=True)
class _Delivered:
    clock: SimClock
    ready_at: float
    reply: Mapping[str, Any]

    def done(self) -> bool:
        return self.clock.now() >= self.ready_at - 1e-9

    def result(self) -> Mapping[str, Any]:
        return self.reply


class DelayedRequests:
    """Answers each observation at once (the clock stands still) and hands the reply to the robot after
    `delay_steps` more actions: the observation is taken before tick k's action, the reply is there at
    tick k + delay_steps. latency_steps: draws each request's latency in control steps from the request
    instead (a fraction: the reply is there at the first tick after it; `client/latency.py`)."""

    def __init__(
        self,
        infer: Callable[[dict], Mapping[str, Any]],
        clock: SimClock,
        delay_steps: int,
        control_hz: float,
        latency_steps: Callable[[Mapping[str, Any]], float] | None = None,
    ):
        self._infer, self._clock, self._control_hz = infer, clock, control_hz
        self._latency_steps = latency_steps or (lambda _: float(delay_steps))

    def submit(self, obs: dict) -> _Delivered:
        latency_s = self._latency_steps(obs) / self._control_hz
        return _Delivered(self._clock, self._clock.now() + latency_s, self._infer(obs))


class SimRobot(Robot, Protocol):
    """A simulated robot: `done` ends its episode (success, collision, a physics error)."""

    @property
    def done(self) -> bool: ...

    def position(self) -> np.ndarray:
        """Its configuration now (gripper position, joint angles): the jerk is measured on it."""


@dataclasses.dataclass(frozen=True)
class Motion:
    """One episode's motion: control ticks run (waits included), the jump at every change of chunk where
    the old chunk still had an action for that tick, the robot's positions [ticks + 1, dims] and their mean
    jerk (norm of the third difference per tick)."""

    ticks: int
    jumps: list[float]
    positions: np.ndarray
    jerk: float


def run(
    robot: SimRobot,
    infer: Callable[[dict], Mapping[str, Any]],
    *,
    execution: str,
    delay_steps: int,
    execution_horizon: int,
    control_hz: float,
    max_ticks: int,
    prefix_horizon: int | None = None,
    latency_steps: Callable[[Mapping[str, Any]], float] | None = None,
    delay_estimate: int | None = None,
    clock: SimClock | None = None,
) -> Motion:
    """One episode: `Executor` in mode `execution` on a simulated clock (`clock`, or a new one: pass one
    to a world that moves with time) until the robot is done or `max_ticks` have run. `infer` keeps the
    robot's last chunk (a fresh `LocalRobot.infer` per episode). latency_steps: draws each request's
    latency from the request (default: `delay_steps` every time); delay_estimate: the d the robot sends
    with `rtc` (default: `delay_steps`). `bid` runs the robot as `rtc` does: the policy behind `infer` is
    what differs (`robots/bid_robot.py`)."""
    clock = clock or SimClock()
    config = ExecutorConfig(
        control_hz=control_hz,
        execution_horizon=execution_horizon,
        mode="rtc" if execution == "bid" else execution,
        delay_steps=delay_steps if delay_estimate is None else delay_estimate,
        prefix_horizon=prefix_horizon,
    )
    requests = DelayedRequests(infer, clock, delay_steps, control_hz, latency_steps)
    return drive(robot, Executor(config, robot, requests=requests, clock=clock), max_ticks)


def drive(robot: SimRobot, executor: Executor, max_ticks: int) -> Motion:
    """Ticks `executor` (on any clock: simulated, or a real one against a server) until the robot is done
    or `max_ticks` have run; the episode's motion."""
    positions = [robot.position()]
    while executor.stats.ticks < max_ticks and not robot.done:
        executor.tick()
        positions.append(robot.position())
    stacked = np.stack(positions)
    jerk = np.linalg.norm(np.diff(stacked, n=3, axis=0), axis=1)
    return Motion(
        ticks=executor.stats.ticks,
        jumps=[s.jump for s in executor.stats.switches if s.jump is not None],
        positions=stacked,
        jerk=float(jerk.mean()) if jerk.size else 0.0,
    )


class _Moved(Protocol):
    jumps: list[float]
    jerk: float


def motion_summary(episodes: Sequence[_Moved]) -> dict[str, Any]:
    """The switch and smoothness fields of results.json over episodes."""
    jumps = [j for e in episodes for j in e.jumps]
    return {
        "switch_jump_mean": float(np.mean(jumps)) if jumps else None,
        "switch_jump_max": float(np.max(jumps)) if jumps else None,
        "switches": len(jumps),
        "jerk_mean": float(np.mean([e.jerk for e in episodes])),
    }


def check_delay(delay_steps: int, horizon: int, execution: str, execution_horizon: int) -> None:
    """InvalidArgumentError (one line) for a delay the loop cannot run: d >= H, or for naive and rtc a d
    beyond the actions left when the next chunk is asked for (the chunk would run out before the reply)."""
    if not 0 <= delay_steps < horizon:
        raise InvalidArgumentError(f"delay_steps must lie in [0, {horizon - 1}], got {delay_steps}")
    if execution != "sync" and delay_steps > execution_horizon:
        raise InvalidArgumentError(
            f"delay_steps {delay_steps} exceeds execution_horizon {execution_horizon}: the chunk runs out"
        )


def default_execution_horizon(horizon: int) -> int:
    """H/2 + 1 actions left when the next chunk is asked for, in every mode: up to d = H/2 the old chunk
    still has an action for the step the new chunk starts at, so naive's and rtc's jumps are measured."""
    return horizon // 2 + 1


def delay_from_latency(latency_ms: float, control_hz: float) -> int:
    """Control steps a reply of `latency_ms` takes, rounded up: the d the robot advances meanwhile."""
    return math.ceil(latency_ms * control_hz / 1000 - 1e-6)
