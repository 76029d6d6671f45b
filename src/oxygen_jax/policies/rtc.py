"""Real-time chunking: the server side of the `rtc` protocol, one robot at a time.

`RobotChunks` is one robot's state (its last chunk as the model computed it and as the robot executes
it, chunk ids, stale marking, the delay estimate); `RtcPolicy` serves one robot on a local `Policy` with
it, and the multi-robot session (`serving/session.py`) keeps one per robot connection. An observation
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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from oxygen_jax.client import protocol, simulated
from oxygen_jax.engine.api import ChunkGuidance
from oxygen_jax.errors import InvalidArgumentError, InvalidRequest
from oxygen_jax.models.pi05 import Pi05Config
from oxygen_jax.policies import rtc_defaults
from oxygen_jax.policies.executed_chunk import ExecutedChunkGuidance
from oxygen_jax.policies.policy import MAX_SAMPLES, Policy
from oxygen_jax.policies.request_options import RequestOptions, value_kind

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


class RtcPolicy:
    """One robot's policy with real-time chunking. Thread-safe: one call computes at a time.

    fresh_samples: a request without `rtc` (a chunk that continues none, such as the first) draws this
    many chunks and keeps the one inside the motion most of them took (`RequestOptions.samples`): with
    `rtc` the robot executes d actions of that chunk before any later one can correct it. None: the
    model config's `rtc.samples` (`rtc_defaults`). A reply to a request with `rtc` names the method that
    ran, `rtc_method` (guided, or conditioned for a model trained with a clean prefix)."""

    def __init__(
        self,
        policy: Policy,
        *,
        schedule: str = "exp",
        max_guidance_weight: float = 5.0,
        fresh_samples: int | None = None,
    ):
        self._policy = policy
        self._lock = threading.Lock()
        self.chunks = RobotChunks(schedule=schedule, max_guidance_weight=max_guidance_weight)
        self.fresh_samples = rtc_defaults.samples(policy.metadata) if fresh_samples is None else fresh_samples
        self.method = rtc_defaults.method(policy.engine.config.max_clean_prefix)

    @property
    def metadata(self) -> dict[str, Any]:
        return self._policy.metadata

    def infer(self, obs: Mapping[str, Any], **kwargs) -> dict[str, Any]:
        """`Policy.infer`, guided when `obs` carries `rtc`; the reply adds chunk_id, start and stale."""
        arrival = self.chunks.arrive()
        rtc = obs.get(protocol.RTC)
        obs = {k: v for k, v in obs.items() if k != protocol.RTC}
        with self._lock:
            guidance, start = self.chunks.guidance(rtc, self._policy.engine.config.action_horizon)
            samples = self.fresh_samples if rtc is None else 1
            prepared = self._policy.prepare(obs, RequestOptions(**kwargs, guidance=guidance, samples=samples))
            chunk, text, timing = self._policy.execute(prepared)
            reply = self._policy.finish(prepared, chunk, text)
            method = {} if rtc is None else {"rtc_method": self.method}
            return {
                **reply,
                **method,
                "policy_timing": timing,
                **self.chunks.answered(arrival, chunk, reply["actions"], timing["infer_ms"] / 1000),
                protocol.START: start,
            }


@dataclasses.dataclass(frozen=True)
class GuidanceSettings:
    """The guidance of a closed-loop evaluation: the server's schedule and beta, the prefix horizon s the
    robot sends (None: every action left in its current chunk, the executor's default), noise_dims,
    the leading model action dims the action noise is drawn on (None: all of them, as openpi draws it;
    the rest are 0, `draw_noise`), and fresh_samples, the chunks a request without `rtc` draws
    (`RtcPolicy`; None: the model config's, `rtc_defaults`)."""

    schedule: str = "exp"
    max_guidance_weight: float = 5.0
    prefix_horizon: int | None = None
    noise_dims: int | None = None
    fresh_samples: int | None = None

    def check(
        self, model: Pi05Config, *, execution: str, delays: Sequence[int], execution_horizon: int
    ) -> None:
        """InvalidArgumentError (one line) for a closed-loop run `model` cannot take: a delay the loop cannot
        run (`simulated.check_delay`) or a noise_dims its actions do not have. The closed-loop tools call it
        from the config, before the model loads."""
        for delay in delays:
            simulated.check_delay(delay, model.action_horizon, execution, execution_horizon)
        if self.noise_dims is not None and not 1 <= self.noise_dims <= model.action_dim:
            raise InvalidArgumentError(
                f"noise_dims must lie in [1, {model.action_dim}] (the model's action dims),"
                f" got {self.noise_dims}"
            )
        if self.fresh_samples is not None and not 1 <= self.fresh_samples <= MAX_SAMPLES:
            raise InvalidArgumentError(
                f"fresh_samples must lie in [1, {MAX_SAMPLES}], got {self.fresh_samples}"
            )

    def for_policy(self, policy: Policy) -> "GuidanceSettings":
        """These settings with fresh_samples resolved: the policy's config default where None."""
        if self.fresh_samples is not None:
            return self
        return dataclasses.replace(self, fresh_samples=rtc_defaults.samples(policy.metadata))

    def fields(self) -> dict[str, Any]:
        """Its results.json fields."""
        return {
            "rtc_schedule": self.schedule,
            "max_guidance_weight": self.max_guidance_weight,
            "prefix_horizon": self.prefix_horizon,
            "noise_dims": self.noise_dims,
            "fresh_samples": self.fresh_samples,
        }


DEFAULT_GUIDANCE = GuidanceSettings()
# One chunk per request whatever the model's config says: what the model alone samples.
ONE_SAMPLE = GuidanceSettings(fresh_samples=1)


def seeded_infer(
    policy: Policy, guidance: GuidanceSettings, rng: np.random.Generator
) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """A fresh one-robot `RtcPolicy.infer` on `policy` whose action noise [H, action_dim] is drawn from
    `rng`, one draw per request: the same seed gives every execution mode the same noise stream. A request
    that draws several chunks (`fresh_samples`) takes the others' noise from a stream spawned off `rng`,
    which leaves `rng`'s own draws as they are."""
    guidance = guidance.for_policy(policy)
    served = RtcPolicy(
        policy,
        schedule=guidance.schedule,
        max_guidance_weight=guidance.max_guidance_weight,
        fresh_samples=guidance.fresh_samples,
    )
    shape = (policy.engine.config.action_horizon, policy.engine.config.action_dim)
    others = rng.spawn(1)[0]

    def infer(obs: Mapping[str, Any]) -> dict[str, Any]:
        samples = guidance.fresh_samples if protocol.RTC not in obs else 1
        return served.infer(obs, noise=draw_samples(rng, others, shape, guidance.noise_dims, samples))

    return infer


def draw_samples(
    rng: np.random.Generator,
    others: np.random.Generator,
    shape: tuple[int, int],
    noise_dims: int | None,
    samples: int,
) -> np.ndarray:
    """The noise of one request: [H, action_dim] from `rng` for one sample; for several, that draw first
    and the others' from `others` [samples, H, action_dim], so `rng`'s stream is the same either way."""
    noise = draw_noise(rng, shape, noise_dims)
    if samples == 1:
        return noise
    return np.stack([noise, *(draw_noise(others, shape, noise_dims) for _ in range(samples - 1))])


def draw_noise(rng: np.random.Generator, shape: tuple[int, int], noise_dims: int | None) -> np.ndarray:
    """Standard normal action noise [H, action_dim], zero past the first `noise_dims` dims (None: none
    zeroed). The draw is the same either way, so a seed gives the kept dims the same values.

    Training pads a robot's actions with zeros past its own dims, yet draws the noise on all of them, as
    openpi does; how much the noise on the padding dims moves the real ones depends on the model, and this
    ablation measures it (docs/rtc.md, on `pi05_detour`).
    """
    noise = rng.standard_normal(shape).astype(np.float32)
    if noise_dims is not None:
        noise[:, noise_dims:] = 0.0
    return noise
