"""One robot: what it keeps between requests, and the one sequence each of its requests takes.

A `Robot` owns one robot's state: its name, how many of its observations reached a runtime (refused
requests do not count), its real-time-chunking chunks (`RobotChunks`), its language requests still to
report (grouped by the observation that started them) and the tokenizer warnings it had once. Every
request of it, served or local, takes one sequence, written here once:

    prepare (arrive, its `rtc` guidance, `Policy.prepare`; any thread)
      -> a runtime (the shared one, `Robots`; or the inline one, `LocalRobot`)
      -> finish (the kept chunk, `Policy.finish`, the reply's robot, text and `rtc` fields)

A reply holds openpi's `actions`, `robot_id`, `observation_index` (the robot's observation counter, from
0), `text_request_started` (the id of the language request this observation started, task name -> id
with text tasks, or None), `policy_timing`, and the `rtc` fields every reply carries: `chunk_id`, `start`
(the new chunk's index the robot switches at; 0 without `rtc`), `stale` (a newer request of the robot
arrived before it was answered) and, for a request with `rtc`, `rtc_method` (which method ran).
"""

import contextvars
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any

import numpy as np

from oxygen_jax.client import protocol
from oxygen_jax.errors import InvalidRequest
from oxygen_jax.policies import rtc_defaults
from oxygen_jax.policies.executed_chunk import ExecutedChunkGuidance
from oxygen_jax.policies.policy import MAX_SAMPLES, Policy, PreparedRequest
from oxygen_jax.policies.request_options import RequestOptions
from oxygen_jax.robots.chunks import RobotChunks
from oxygen_jax.robots.speech import LanguageRequest, TextGroup
from oxygen_jax.runtime.inline import Speech, TextPlan

# The robot whose request this thread prepares, if any (see `_OncePerRobot`).
_PREPARING: contextvars.ContextVar["Robot | None"] = contextvars.ContextVar("preparing", default=None)


class _OncePerRobot(logging.Filter):
    """Lets each warning of the tokenizer through once per robot: a robot that sends a prompt over the
    token budget every request (it is cut each time) would otherwise log a warning per request."""

    def filter(self, record: logging.LogRecord) -> bool:
        robot = _PREPARING.get()
        if robot is None:
            return True
        if record.msg in robot.logged:
            return False
        robot.logged.add(record.msg)
        if isinstance(record.args, tuple):
            record.msg, record.args = (
                f"{record.msg} (robot %s; once per robot)",
                (*record.args, robot.robot_id),
            )
        return True


logging.getLogger("oxygen_jax.tokenizer").addFilter(_OncePerRobot())


@dataclasses.dataclass
class RobotRequest:
    """One robot's raw observation with this request's options (as `Policy.infer` takes them).

    `client` names the robot: its state lives across the requests that carry the same client.
    `robot_id` labels it in replies and text events (default `robot-<n>`, kept from its first request).
    The text options apply to the language request this one starts, if it starts one;
    `max_text_tokens=0` starts none. `rtc`: the request's real-time-chunking entry (the `rtc` protocol,
    `client/protocol.py`), None for plain actions.
    """

    client: Hashable
    obs: Mapping[str, Any]
    options: RequestOptions = dataclasses.field(default_factory=RequestOptions)
    robot_id: str | None = None
    rtc: Any = None


@dataclasses.dataclass
class Turn:
    """One request of a robot between `Robot.prepare` and `Robot.finish`: the prepared request, its
    arrival number, the index its reply starts at, when it was received, its `rtc` guidance (None without
    `rtc`), and once it reached a runtime (`Robot.begin`) its observation index and the language requests
    it started."""

    prepared: PreparedRequest
    arrival: int
    start: int
    received: float
    guidance: ExecutedChunkGuidance | None
    index: int = -1
    group: TextGroup | None = None


# Starts one language request of the robot on the runtime (its id is the runtime's).
StartText = Callable[["Robot", TextPlan], LanguageRequest]


class Robot:
    """One robot's state and its request sequence (`prepare`, `begin`, `finish`); thread-safe."""

    def __init__(
        self, policy: Policy, robot_id: str, *, schedule: str = "exp", max_guidance_weight: float = 5.0
    ) -> None:
        self.policy = policy
        self.robot_id = robot_id
        self.observations = 0  # the next observation's index
        self.groups: list[TextGroup] = []  # language requests to report, oldest first
        self.chunks = RobotChunks(schedule=schedule, max_guidance_weight=max_guidance_weight)
        self.logged: set[str] = set()  # tokenizer warnings it had once
        self.lock = threading.Lock()

    @property
    def method(self) -> str:
        """How its model continues a chunk (`rtc_defaults`): conditioned or guided."""
        return rtc_defaults.method(self.policy.engine.config.max_clean_prefix)

    def prepare(
        self,
        obs: Mapping[str, Any],
        options: RequestOptions,
        rtc: Any = None,
        *,
        max_tasks: int | None = None,
        max_samples: int = MAX_SAMPLES,
    ) -> Turn:
        """Checks and prepares one request, guided towards the robot's last chunk when it carries `rtc`
        (`InvalidRequest` names what is wrong and leaves the robot's state as it was)."""
        received = time.perf_counter()
        guidance, start = self.chunks.guidance(rtc, self.policy.engine.config.action_horizon)
        preparing = _PREPARING.set(self)
        try:
            prepared = self.policy.prepare(
                obs, dataclasses.replace(options, guidance=guidance), max_tasks=max_tasks
            )
        finally:
            _PREPARING.reset(preparing)
        if prepared.samples > max_samples:
            raise InvalidRequest(
                f"samples must lie in [1, {max_samples}] on this server, got {prepared.samples}"
            )
        # Numbered only once accepted: a refused request leaves the robot's earlier replies current.
        return Turn(prepared, self.chunks.arrive(), start, received, guidance)

    def begin(self, turn: Turn, start_text: StartText | None = None) -> None:
        """The request reached a runtime: numbers its observation and, when the robot has no language
        request in flight and this one asks for text, starts its group through `start_text` (None: the
        runtime decodes the text within the request, `LocalRobot`)."""
        with self.lock:
            turn.index = self.observations
            self.observations += 1
            if start_text is None or not turn.prepared.texts or not all(g.done for g in self.groups):
                return
            turn.group = TextGroup(turn.index, [start_text(self, plan) for plan in turn.prepared.texts])
            self.groups.append(turn.group)

    def failed(self, turn: Turn) -> None:
        """The runtime could not compute the request: the language requests it started never joined (a
        batch joins all or none), so they are not reported."""
        with self.lock:
            if turn.group is not None and any(group is turn.group for group in self.groups):
                self.groups.remove(turn.group)

    def finish(
        self,
        turn: Turn,
        chunks: np.ndarray,
        timing: Mapping[str, float],
        text: Mapping[str | None, Speech] | None = None,
        *,
        method: str | None = None,
    ) -> dict[str, Any]:
        """The reply to `turn`: its chunk ([H, A], or [samples, H, A] of which `Policy.finish` keeps the
        densest) through the robot's output transforms, its text (`text` when the runtime decoded it
        within the request, else the robot's oldest unreported language requests), and the `rtc` fields.
        method: what chose a chunk continuing the last one (default: the model's `rtc` method)."""
        chunks = np.asarray(chunks)
        fields: dict[str, Any] = {}
        if text is None:
            text, fields = self._oldest_text()
        outputs = self.policy.finish(turn.prepared, chunks, text)
        chunk = chunks if chunks.ndim == 2 else chunks[outputs.get("kept_sample", 0)]
        reply = {
            **outputs,
            **fields,
            "robot_id": self.robot_id,
            "observation_index": turn.index,
            "text_request_started": _started(turn.group),
            "policy_timing": dict(timing),
        }
        latency_s = time.perf_counter() - turn.received
        reply.update(self.chunks.answered(turn.arrival, chunk, reply["actions"], latency_s))
        reply[protocol.START] = turn.start
        if turn.guidance is not None:
            reply["rtc_method"] = method or self.method
        return reply

    def language_requests(self) -> Iterator[LanguageRequest]:
        """Its language requests still to report."""
        with self.lock:
            requests = [request for group in self.groups for request in group.requests]
        yield from requests

    def _oldest_text(self) -> tuple[dict[str | None, Speech] | None, dict[str, Any]]:
        """The text of the robot's oldest unreported group of language requests, and the fields that name
        it (which request, which observation, whether done); a group is reported done once."""
        with self.lock:
            if not self.groups:
                return None, {}
            group = self.groups[0]
            done = group.done
            if done:
                self.groups.pop(0)
            said = {request.task: request.said() for request in group.requests}
        fields: dict[str, Any] = {"text_done": done, "text_observation_index": group.observation_index}
        if group.requests[0].task is None:
            fields["text_request_id"] = group.requests[0].request_id
        else:
            fields["text_request_ids"] = {request.task: request.request_id for request in group.requests}
        return said, fields


def _started(group: TextGroup | None) -> int | dict[str, int] | None:
    """What a reply's `text_request_started` says: the id of the request its observation started, task
    name -> id with text tasks, or None."""
    if group is None:
        return None
    ids = {request.task: request.request_id for request in group.requests}
    return ids.get(None, ids)


class Roster:
    """Robots by client, each named by its first request's `robot_id` or `robot-<n>`, renamed when a
    later request names it; thread-safe."""

    def __init__(self, make: Callable[[str], Robot]) -> None:
        self._make = make
        self._numbers = itertools.count()
        self._robots: dict[Hashable, Robot] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._robots)

    def get(self, client: Hashable, robot_id: str | None = None) -> Robot:
        with self._lock:
            robot = self._robots.get(client)
            if robot is None:
                robot = self._robots[client] = self._make(robot_id or f"robot-{next(self._numbers)}")
            elif robot_id is not None:
                robot.robot_id = robot_id
            return robot

    def pop(self, client: Hashable) -> Robot | None:
        with self._lock:
            return self._robots.pop(client, None)
