"""Real-time chunking: the server side of the `rtc` protocol, one robot at a time.

`RobotChunks` is one robot's real-time-chunking state (its last chunk as the model computed it and as the
robot executes it, chunk ids, stale marking, the delay estimate); every `Robot` keeps one. An observation
carrying `rtc: {"executed": i, "delay": d, "horizon": s}` (see `oxygen_jax.client.protocol`) is answered
with a chunk guided towards that last chunk shifted by the i actions already executed (`align`), as the
robot executes it, expressed in the new request's model space (`ExecutedChunkGuidance`; what
delta-action robots need, whose model chunks are relative to the state they were planned from); without
`rtc` the reply is the policy's plain one. Every reply adds `chunk_id`, `start` (d, or 0) and `stale` (a newer
request of this robot arrived while it was computed). Bad `rtc` values are refused with a one-line error
and leave the robot's state as it was.
"""

import dataclasses
import itertools
import math
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from oxygen_jax.client import protocol
from oxygen_jax.engine.api import ChunkGuidance
from oxygen_jax.errors import InvalidArgumentError, InvalidRequest
from oxygen_jax.policies.executed_chunk import ExecutedChunkGuidance
from oxygen_jax.policies.request_options import value_kind

# Far above any robot's control rate; a bound keeps the delay estimate (latency * rate) a finite int.
MAX_CONTROL_HZ = 10_000.0
# The fields an `rtc` entry may hold (`oxygen_jax.client.protocol`).
FIELDS = ("executed", "delay", "horizon", protocol.CHUNK_ID, "control_hz")


class RtcError(InvalidRequest, InvalidArgumentError):
    """An `rtc` entry the server cannot use (the message names the field): a bad request."""


@dataclasses.dataclass(frozen=True)
class RtcRequest:
    executed: int
    delay: int
    horizon: int


def _field(rtc: Mapping, name: str, default: int | None = None) -> int:
    value = rtc.get(name, default)
    if value is None:
        raise RtcError(f"rtc.{name} is missing")
    if isinstance(value, bool | np.timedelta64) or not isinstance(value, int | np.integer):
        raise RtcError(f"rtc.{name} must be an int, got {value_kind(value)}")
    if value < 0:
        raise RtcError(f"rtc.{name} must be >= 0, got {value}")
    return int(value)


def _control_hz(value: Any) -> float:
    """A stated control rate: a number in (0, MAX_CONTROL_HZ] (inf and NaN are refused)."""
    numeric = int | float | np.integer | np.floating
    if isinstance(value, bool | np.timedelta64) or not isinstance(value, numeric):
        raise RtcError(f"rtc.control_hz must be a number, got {value_kind(value)}")
    if not 0 < value <= MAX_CONTROL_HZ:
        raise RtcError(f"rtc.control_hz must lie in (0, {MAX_CONTROL_HZ:g}], got {value}")
    return float(value)


def check_entry(rtc: Any, horizon: int) -> None:
    """Checks what an observation's `rtc` entry says on its own, against the model's horizon H: a map of
    the known fields, each of its type and range (the robot's state is `parse_request`'s to check)."""
    if not isinstance(rtc, Mapping):
        raise RtcError(f"rtc must be a dict with executed, delay, horizon; got {type(rtc).__name__}")
    unknown = sorted(str(key) for key in rtc if key not in FIELDS)
    if unknown:
        raise RtcError(f"rtc: unknown field(s) {unknown}; known: {list(FIELDS)}")
    executed = _field(rtc, "executed")
    for name in ("delay", "horizon", protocol.CHUNK_ID):
        if name in rtc:
            _field(rtc, name)
    if "control_hz" in rtc:
        _control_hz(rtc["control_hz"])
    if executed > horizon:
        raise RtcError(f"rtc.executed {executed} is beyond the last chunk's {horizon} actions")
    if "delay" in rtc and rtc["delay"] >= horizon:
        raise RtcError(f"rtc.delay {rtc['delay']} must be < the action horizon {horizon}")


def parse_request(
    rtc: Any, horizon: int, last_chunk_id: int | None, estimated_delay: int | None
) -> RtcRequest:
    """Checks an observation's `rtc` entry (`check_entry`) and against this robot's last chunk.

    delay defaults to `estimated_delay` (the server's own latency in control steps, when it knows the
    robot's control_hz); horizon defaults to every action of the last chunk not yet executed.
    """
    check_entry(rtc, horizon)
    if last_chunk_id is None:
        raise RtcError("rtc needs a previous chunk: this robot has not been sent one yet")
    if protocol.CHUNK_ID in rtc and _field(rtc, protocol.CHUNK_ID) != last_chunk_id:
        raise RtcError(f"rtc.chunk_id {rtc[protocol.CHUNK_ID]} is not the last chunk sent ({last_chunk_id})")
    executed = _field(rtc, "executed")
    if "delay" not in rtc and estimated_delay is None:
        raise RtcError("rtc.delay is missing and the robot's control_hz is unknown to estimate it")
    delay = _field(rtc, "delay", estimated_delay)
    if delay >= horizon:
        raise RtcError(f"rtc.delay {delay} must be < the action horizon {horizon}")
    end = _field(rtc, "horizon", max(horizon - executed, delay))
    if not delay <= end <= horizon:
        raise RtcError(f"rtc.horizon {end} must lie in [delay={delay}, {horizon}]")
    return RtcRequest(executed, delay, end)


def align(chunk: np.ndarray, executed: int) -> np.ndarray:
    """The chunk [H, A] seen from `executed` actions later: row i is chunk[executed + i], the last action
    repeated past the end."""
    index = np.minimum(np.arange(len(chunk)) + executed, len(chunk) - 1)
    return chunk[index]


class RobotChunks:
    """One robot's real-time-chunking state, shared by every server path (thread-safe).

    It numbers the robot's requests as they arrive (a reply computed after a newer request arrived is
    stale), keeps the last chunk sent (in model space and as the robot executes it, the reply's
    `actions`) with its `chunk_id`, the robot's `control_hz` once stated and the server's last measured
    latency, which together estimate `delay` when a request leaves it out. A stale reply does not become
    the last chunk: the robot ignores it and keeps executing the one before. A refused `rtc` leaves the
    state as it was.
    """

    def __init__(self, *, schedule: str = "exp", max_guidance_weight: float = 5.0):
        self.schedule = schedule
        self.max_guidance_weight = max_guidance_weight
        self._lock = threading.Lock()
        self._arrivals = itertools.count()
        self.latest = -1  # the newest arrival
        self._chunk: np.ndarray | None = None  # model space [H, action_dim]
        self._executed: np.ndarray | None = None  # robot action space [H, robot dims]
        self._chunk_id: int | None = None
        self._next_chunk_id = 0
        self._control_hz: float | None = None
        self._latency_s: float | None = None

    def arrive(self) -> int:
        """Numbers a new request of this robot."""
        with self._lock:
            self.latest = next(self._arrivals)
            return self.latest

    def guidance(self, rtc: Any, horizon: int) -> tuple[ExecutedChunkGuidance | None, int]:
        """(the guidance of a request with this `rtc` entry, the index its reply starts at); (None, 0)
        without `rtc`. RtcError (one line) for values it cannot use."""
        if rtc is None:
            return None, 0
        with self._lock:
            check_entry(rtc, horizon)
            control_hz = self._control_hz
            if "control_hz" in rtc:
                control_hz = _control_hz(rtc["control_hz"])
            estimate = None
            if control_hz and self._latency_s is not None:
                estimate = math.ceil(self._latency_s * control_hz)
            request = parse_request(rtc, horizon, self._chunk_id, estimate)
            prev = align(self._chunk, request.executed)
            executed = align(self._executed, request.executed)
            self._control_hz = control_hz
        weight = self.max_guidance_weight
        planned = ChunkGuidance(prev, request.delay, request.horizon, self.schedule, weight)
        return ExecutedChunkGuidance(planned, executed), request.delay

    def answered(
        self, arrival: int, chunk: np.ndarray, actions: np.ndarray, latency_s: float
    ) -> dict[str, Any]:
        """Records the reply to request `arrival` (its model-space chunk [H, A], its `actions` as the robot
        executes them [H, robot dims], and how long the server took); returns its `chunk_id` and `stale`
        fields."""
        with self._lock:
            chunk_id = self._next_chunk_id
            self._next_chunk_id += 1
            self._latency_s = latency_s
            stale = arrival < self.latest
            if not stale:
                self._chunk, self._chunk_id = np.asarray(chunk, np.float32), chunk_id
                self._executed = np.array(actions)
        return {protocol.CHUNK_ID: chunk_id, protocol.STALE: stale}
