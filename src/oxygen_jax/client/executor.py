"""A robot's control loop over action chunks, asking for the next chunk while it executes the current one.

Every control tick (1 / control_hz) the robot executes one action. When `execution_horizon` actions of
the current chunk remain, it sends an observation and, by mode:
- `sync`: stops until the reply arrives and starts the new chunk at index 0 (the robot did not move);
- `naive`: keeps executing the current chunk; when the reply arrives, after the robot executed e more
  actions, it switches to the new chunk at index e (the new chunk's index for the same progress), so it
  may jump;
- `rtc`: as `naive`, but the observation says how far the robot got and how many steps d it expects the
  inference to take (`protocol.rtc_request`), so the server guides the new chunk to agree with the old
  one; the robot keeps the old chunk until index max(d, e) and switches there.
A tick without an action (waiting for a chunk) is a stall. Replies are polled once per tick, never
waited for; time comes from a `Clock` and replies from `Requests`, so tests drive the loop on a fake
clock without threads or sleeps.
"""

import concurrent.futures
import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from oxygen_jax.client import protocol

MODES = ("sync", "naive", "rtc")
_LATENCY_WINDOW = 3  # replies whose longest latency sets the delay sent with `rtc`


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic clock."""

    def sleep_until(self, deadline: float) -> None:
        """Returns at `deadline` (at once if it has passed)."""


class Pending(Protocol):
    """A request in flight (`concurrent.futures.Future` is one)."""

    def done(self) -> bool: ...

    def result(self) -> Mapping[str, Any]:
        """The reply; blocks until it is there."""


class Requests(Protocol):
    def submit(self, obs: dict) -> Pending: ...


class Robot(Protocol):
    def observe(self) -> dict:
        """The current observation, as the policy takes it."""

    def act(self, action: np.ndarray) -> None:
        """Applies one action [A]."""


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()

    def sleep_until(self, deadline: float) -> None:
        time.sleep(max(0.0, deadline - time.monotonic()))


class SimClock:
    """Simulated time: `sleep_until` moves the clock forward instead of waiting (closed-loop evaluation,
    tests)."""

    def __init__(self):
        self._now = 0.0

    def now(self) -> float:
        return self._now

    def sleep_until(self, deadline: float) -> None:
        self._now = max(self._now, deadline)


class ThreadedRequests:
    """`policy.infer(obs)` on one background thread: the control loop keeps running meanwhile."""

    def __init__(self, infer: Callable[[dict], Mapping[str, Any]]):
        self._infer = infer
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)

    def submit(self, obs: dict) -> Pending:
        return self._pool.submit(self._infer, obs)


@dataclasses.dataclass(frozen=True)
class ExecutorConfig:
    """control_hz: actions per second; execution_horizon: actions left in the current chunk when the next
    one is requested; delay_steps: the d sent with `rtc` (None: the longest latency of the last 3 replies,
    in control steps, rounded up); prefix_horizon: the s sent with `rtc` (None: every action left in the
    current chunk)."""

    control_hz: float
    execution_horizon: int
    mode: str = "rtc"
    delay_steps: int | None = None
    prefix_horizon: int | None = None

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if not self.control_hz > 0:
            raise ValueError(f"control_hz must be > 0, got {self.control_hz}")
        if self.execution_horizon < 0 or (self.delay_steps or 0) < 0 or (self.prefix_horizon or 0) < 0:
            raise ValueError("execution_horizon, delay_steps and prefix_horizon must be >= 0")


@dataclasses.dataclass(frozen=True)
class Switch:
    """One change of chunk: at control tick `tick`, chunk `chunk_id` from index `start`; `jump` = max |new
    action - the action the old chunk had for that tick| (None when the old chunk had run out)."""

    tick: int
    chunk_id: int
    start: int
    jump: float | None


@dataclasses.dataclass
class ExecutorStats:
    ticks: int = 0
    actions: int = 0
    stalls: int = 0  # ticks without an action: waiting for a reply
    requests: int = 0
    stale_replies: int = 0
    latencies_s: list[float] = dataclasses.field(default_factory=list)
    latency_ticks: list[int] = dataclasses.field(default_factory=list)  # ticks from request to its reply
    switches: list[Switch] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _InFlight:
    pending: Pending
    sent_at: float
    sent_tick: int
    executed_since: int = 0  # actions executed since the observation was taken
    reply: protocol.ChunkReply | None = None


class Executor:
    def __init__(
        self,
        config: ExecutorConfig,
        robot: Robot,
        *,
        requests: Requests | None = None,
        infer: Callable[[dict], Mapping[str, Any]] | None = None,
        clock: Clock | None = None,
    ):
        """requests: how observations reach the policy; default: `infer` (openpi's `policy.infer`) on a
        background thread."""
        if (requests is None) == (infer is None):
            raise ValueError("give exactly one of requests= and infer=")
        self.config = config
        self.robot = robot
        self.requests = requests or ThreadedRequests(infer)
        self.clock = clock or MonotonicClock()
        self.stats = ExecutorStats()
        self._chunk: protocol.ChunkReply | None = None
        self._index = 0
        self._in_flight: _InFlight | None = None
        self._next_tick: float | None = None

    def run(self, ticks: int) -> ExecutorStats:
        """`ticks` control ticks (the first ones stall until a first chunk arrives)."""
        for _ in range(ticks):
            self.tick()
        return self.stats

    def tick(self) -> None:
        """Takes a reply that is due, asks for the next chunk when `execution_horizon` actions remain,
        executes one action (or stalls), then waits for the next tick.

        The observation is taken before this tick's action, so a request can leave in the tick that
        switched chunks: a reply d ticks later then finds d actions executed, and a chunk that starts
        with d actions left lasts until the next one arrives (no stall at d = E)."""
        if self._in_flight is not None:
            self._take_reply()
        if self._in_flight is None and self._wants_next_chunk():
            self._request()
            self._take_reply()  # a reply without latency is there at once
        if self._waiting():
            self.stats.stalls += 1
        else:
            self.robot.act(self._chunk.actions[self._index])
            self._index += 1
            self.stats.actions += 1
            if self._in_flight is not None:
                self._in_flight.executed_since += 1
        self.stats.ticks += 1
        now = self.clock.now()
        period = 1.0 / self.config.control_hz
        self._next_tick = max((self._next_tick or now) + period, now)
        self.clock.sleep_until(self._next_tick)

    def wait_in_flight(self) -> None:
        """Blocks until the request in flight, if any, is answered (its reply unused): at the end of an
        episode, so that the next one's first request does not queue behind it."""
        if self._in_flight is not None:
            self._in_flight.pending.result()

    def _wants_next_chunk(self) -> bool:
        return self._chunk is None or len(self._chunk.actions) - self._index <= self.config.execution_horizon

    def _waiting(self) -> bool:
        """No action this tick: no chunk yet, the chunk ran out, or `sync` waits for its reply."""
        sync_wait = self.config.mode == "sync" and self._in_flight is not None
        return self._chunk is None or self._index >= len(self._chunk.actions) or sync_wait

    def _request(self) -> None:
        obs = self.robot.observe()
        if self.config.mode == "rtc" and self._chunk is not None:
            left = len(self._chunk.actions) - self._index
            obs = {
                **obs,
                protocol.RTC: protocol.rtc_request(
                    executed=self._index,
                    delay=min(self._delay_steps(), left),
                    horizon=min(self.config.prefix_horizon or left, left),
                    chunk_id=self._chunk.chunk_id,
                ),
            }
        self._in_flight = _InFlight(self.requests.submit(obs), self.clock.now(), self.stats.ticks)
        self.stats.requests += 1

    def _delay_steps(self) -> int:
        if self.config.delay_steps is not None:
            return self.config.delay_steps
        # The first reply may include the server's compilation: left out once there are others.
        recent = self.stats.latencies_s[1:][-_LATENCY_WINDOW:] or self.stats.latencies_s
        steps = max(recent, default=0.0) * self.config.control_hz
        return math.ceil(steps - 1e-6)  # a latency of exactly k ticks (up to float error) is k steps

    def _take_reply(self) -> None:
        """Reads the reply in flight once it is there, and switches to it when the robot reaches the index
        the reply starts at (at once when the robot is waiting)."""
        flight = self._in_flight
        if flight.reply is None:
            if not flight.pending.done():
                return
            flight.reply = protocol.ChunkReply.from_reply(flight.pending.result())
            self.stats.latencies_s.append(self.clock.now() - flight.sent_at)
            self.stats.latency_ticks.append(self.stats.ticks - flight.sent_tick)
        if flight.reply.stale:
            self.stats.stale_replies += 1
            self._in_flight = None
            return
        if not self._waiting() and flight.executed_since < flight.reply.start:
            return  # the current chunk still covers the ticks before the reply's start
        self._switch(flight.reply, flight.executed_since)
        self._in_flight = None

    def _switch(self, reply: protocol.ChunkReply, start: int) -> None:
        jump = None
        if self._chunk is not None and self._index < len(self._chunk.actions) and start < len(reply.actions):
            jump = float(np.max(np.abs(reply.actions[start] - self._chunk.actions[self._index])))
        self.stats.switches.append(Switch(self.stats.ticks, reply.chunk_id, start, jump))
        self._chunk, self._index = reply, start
