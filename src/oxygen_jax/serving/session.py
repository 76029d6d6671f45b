"""Several robots served by one Policy on one runtime: actions per request, language across requests.

A robot request takes the path every request takes: `Policy.prepare` on the caller's thread (checks,
transforms, tokenizing, text tasks), the shared `Runtime` (its device loop prefills the observation
together with whatever other robots' observations wait), then `Policy.finish` on the runtime's output
thread the moment its actions are on the host. A robot without a language request in flight starts one
on that observation; it joins the shared batch state and decodes in the device's idle time
(`loop="async"`) or k tokens per frame before the frame's replies (`loop="frame"`, the paper's loop).

A reply holds openpi's `actions`, the robot's `robot_id`, `observation_index` (the robot's observation
counter, from 0) and `text_request_started`: the id of the language request this observation started
(task name -> id with text tasks), or None. While the robot has a language request to report it also
holds `text` (its text so far), `text_tokens`, `text_done`, `text_request_id` and
`text_observation_index`: which request that text is and which of the robot's observations it describes.
A reply reports the robot's oldest unreported request, and the reply that says `text_done` is the last
for that request, so a text may describe an earlier observation than the reply's own.

A request with `text_tasks` (see `policies.text_tasks`) starts one language request per task instead, each
decoding after its instruction appended to the observation's prefix (one extension call per batch); its
replies carry `texts` and `texts_tokens` (task name -> text so far), `text_done` (every task finished)
and `text_request_ids` (task name -> request id).

Real-time chunking (`rtc` protocol, `policies/rtc.py`): each robot keeps its last chunk (`RobotChunks`);
a request with an `rtc` entry is guided towards that chunk aligned by the actions the robot executed, as
the robot executes it expressed in the request's model space (`Policy.prepare`), in the same batch as
everyone else's (the batch runs the guided program once, other rows plain). Every reply carries
`chunk_id`, `start` (the new chunk's index the robot switches at; 0 without `rtc`) and `stale` (a newer
request of the robot arrived before it was answered). A bad `rtc` is that request's `InvalidRequest`. An
`rtc` without `delay` gets the robot's last latency (receipt to reply) in control steps of its stated
`control_hz`.

A request may draw several action chunks (`samples`, up to the session's `max_samples`): they denoise on
its one prefill (`FrameScheduler`) and the reply keeps the densest, as `Policy.infer` does (`Policy.keep`).

`subscribe` pushes a `TextEvent` for every chunk of new tokens and every finished request, from the
output thread. Actions equal `Policy.infer`'s with the same noise. The first request compiles every shape
steady state can meet (`warmup`), so later ones never compile.
"""

import concurrent.futures
import contextvars
import dataclasses
import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from oxygen_jax.client import protocol
from oxygen_jax.errors import InvalidRequest
from oxygen_jax.policies import rtc_defaults
from oxygen_jax.policies.policy import MAX_SAMPLES, MAX_TASK_TOKENS, Policy, PreparedRequest, Speech
from oxygen_jax.policies.request_options import RequestOptions
from oxygen_jax.policies.rtc import RobotChunks
from oxygen_jax.runtime import runtime
from oxygen_jax.runtime.device_loop import ActionReply, ObservationWork
from oxygen_jax.runtime.requests import TextRequest, TextResult
from oxygen_jax.runtime.runtime import Runtime, RuntimeConfig
from oxygen_jax.runtime.scheduler import FrameInput
from oxygen_jax.serving.request_schema import RequestSchema

logger = logging.getLogger(__name__)
NO_RTC = "rtc: this server does not take real-time-chunking requests"
# The robot whose request this thread prepares, if any (see `_OncePerRobot`).
_PREPARING: contextvars.ContextVar["_Robot | None"] = contextvars.ContextVar("preparing", default=None)


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

    `client` names the robot: its language request lives across the requests that carry the same client.
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


@dataclasses.dataclass(frozen=True)
class TextEvent:
    """New tokens of one language request (`tokens`, possibly none in the final event), its text so far
    and, once it finished, `done` with the reason ("eos", "length" or "cancelled"); `task` names its text
    task (None: the request continues the observation's prompt)."""

    robot_id: str
    request_id: int
    task: str | None
    tokens: np.ndarray
    text: str
    done: bool
    finish_reason: str | None = None


Answer = Callable[[dict[str, Any] | Exception], None]


@dataclasses.dataclass
class _Speech:
    """A robot's language request, fed on the output thread."""

    request_id: int
    robot_id: str
    task: str | None = None
    tokens: list[int] = dataclasses.field(default_factory=list)
    text: str = ""
    result: TextResult | None = None


@dataclasses.dataclass
class _Group:
    """The language requests one observation started (one, or one per text task)."""

    observation_index: int
    speeches: list[_Speech]

    @property
    def done(self) -> bool:
        return all(speech.result is not None for speech in self.speeches)


@dataclasses.dataclass
class _Robot:
    """One connected robot: its name, how many of its observations reached the runtime (refused requests
    do not count), its language requests still to report and its real-time-chunking state."""

    robot_id: str
    observations: int = 0  # the next observation's index
    groups: list[_Group] = dataclasses.field(default_factory=list)  # to report, oldest first
    chunks: RobotChunks = dataclasses.field(default_factory=RobotChunks)
    logged: set[str] = dataclasses.field(default_factory=set)  # tokenizer warnings it had once


class MultiRobotSession:
    """One Policy and one `Runtime` shared by every robot."""

    def __init__(
        self,
        policy: Policy,
        config: RuntimeConfig,
        *,
        max_text_tasks: int = 0,
        rtc: bool = True,
        max_samples: int | None = None,
    ) -> None:
        """config: the runtime (slots, loop, k, prefill batch, gather time); its text budget, denoising
        steps and room for text tasks come from the policy and `max_text_tasks` (the most `text_tasks`
        one request may carry; 0: none, else warm-up also compiles the extension shapes). rtc: take
        real-time-chunking requests (warm-up then compiles the guided denoiser too). max_samples: the most
        action chunks a request may draw (`samples`; warm-up compiles their denoising); None: the model
        config's `rtc.samples` (`rtc_defaults`), what a request that continues no chunk draws."""
        self._policy = policy
        self._rtc = rtc
        self._max_samples = rtc_defaults.samples(policy.metadata) if max_samples is None else max_samples
        if not 1 <= self._max_samples <= MAX_SAMPLES:
            raise ValueError(f"max_samples must lie in [1, {MAX_SAMPLES}], got {self._max_samples}")
        language = policy.max_text_tokens > 0
        self._max_text_tasks = max_text_tasks if language else 0
        config = dataclasses.replace(
            config,
            max_slots=config.max_slots if language else 0,
            max_new_tokens=policy.max_text_tokens,
            num_steps=policy.num_steps,
            task_suffix_len=MAX_TASK_TOKENS if self._max_text_tasks else 0,
            max_frame_tasks=config.max_prefill_batch * self._max_text_tasks,
            guided=rtc,
            max_samples=self._max_samples,
        )
        self._runtime = runtime.build(
            policy.engine, config, detokenize=policy.detokenize, expected_senders=lambda: len(self._robots)
        )
        self._lock = threading.Lock()
        self._warm_lock = threading.Lock()
        self._request_ids = itertools.count()
        self._robot_numbers = itertools.count()
        self._robots: dict[Hashable, _Robot] = {}
        self._listeners: tuple[Callable[[TextEvent], None], ...] = ()
        self._warm = False
        self._schema = RequestSchema(
            policy, max_text_tasks=self._max_text_tasks, rtc_refusal=None if rtc else NO_RTC
        )

    @property
    def schema(self) -> RequestSchema:
        """What a served request to this session may hold (its policy, text tasks and `rtc`)."""
        return self._schema

    @property
    def max_batch(self) -> int:
        return self._runtime.max_batch

    @property
    def runtime(self) -> Runtime:
        return self._runtime

    @property
    def warm(self) -> bool:
        """Every program steady state can meet is compiled (`warmup`, or the first request, did it)."""
        return self._warm

    @property
    def metadata(self) -> dict[str, Any]:
        """The Policy's metadata, plus how this session streams text."""
        return {
            **self._policy.metadata,
            "text_stream": True,
            "loop": self._runtime.mode,
            "max_slots": self._runtime.manager.max_slots,
            "max_batch": self.max_batch,
            "max_text_tasks": self._max_text_tasks,
            "rtc": self._rtc,
            "max_samples": self._max_samples,
        }

    def start(self) -> "MultiRobotSession":
        """Starts the runtime (`submit` and `step` start it when needed)."""
        self._runtime.start()
        return self

    def stop(self) -> None:
        """Answers every observation already received, then stops the runtime."""
        self._runtime.stop()

    def warmup(self, obs: Mapping[str, Any] | None = None) -> None:
        """Compiles every shape steady state can meet, on one raw observation of this robot (its masked
        cameras pick the prefill variant; default: the robot's blank observation with every camera). The
        first request does this when nobody did before."""
        obs = self._policy.io.spec.example() if obs is None else obs
        self._warm_up(self._policy.prepare(obs, RequestOptions(prompt_for_text=False)).arrays)

    def subscribe(self, listener: Callable[[TextEvent], None]) -> Callable[[], None]:
        """Calls `listener(event)` on the output thread for every text event; returns the unsubscribe."""
        with self._lock:
            self._listeners += (listener,)

        def unsubscribe() -> None:
            with self._lock:
                self._listeners = tuple(other for other in self._listeners if other is not listener)

        return unsubscribe

    def submit(self, request: RobotRequest, answer: Answer) -> None:
        """Queues one request (any thread). `answer` gets its reply or the exception that refused it: at
        once for a request that fails its checks (`InvalidRequest`, or a server fault), else on the
        output thread once its actions are ready."""
        work = self._work(request, answer)
        if work is not None:
            self._runtime.submit(work)

    def step(self, requests: Sequence[RobotRequest]) -> list[dict[str, Any] | Exception]:
        """Submits `requests` together (one prefill batch) and waits: per request its reply, or the
        exception that refused it. Each request is prepared on its own, so whatever one raises is that
        request's answer (`InvalidRequest` naming what is wrong with it, or a server fault) and the others go
        on."""
        if len(requests) > self.max_batch:
            raise ValueError(f"a batch takes at most {self.max_batch} requests, got {len(requests)}")
        futures = [concurrent.futures.Future() for _ in requests]
        works = [
            self._work(request, future.set_result) for request, future in zip(requests, futures, strict=True)
        ]
        works = [work for work in works if work is not None]
        if works:
            self._runtime.submit(*works)
        return [future.result() for future in futures]

    def end(self, client: Hashable) -> None:
        """The robot left: its waiting observations are dropped and its language requests stop, freeing
        their slots (before the device's next piece of work)."""
        with self._lock:
            robot = self._robots.pop(client, None)
        if robot is None or not self._runtime.running:
            return
        self._runtime.withdraw(client)
        for speech in (speech for group in robot.groups for speech in group.speeches):
            if speech.result is None:
                self._runtime.cancel(speech.request_id)

    def _work(self, request: RobotRequest, answer: Answer) -> ObservationWork | None:
        """Prepares one request (guided when it carries `rtc`); a robot without a language request in
        flight starts one on this observation. None (and the refusal answered) when the request fails."""
        received = time.perf_counter()
        with self._lock:
            robot = self._robot(request)
            chunks = robot.chunks
        try:
            if request.rtc is not None and not self._rtc:
                raise InvalidRequest(NO_RTC)
            guidance, start = chunks.guidance(request.rtc, self._policy.engine.config.action_horizon)
            options = dataclasses.replace(request.options, guidance=guidance)
            preparing = _PREPARING.set(robot)
            try:
                prepared = self._policy.prepare(request.obs, options, max_tasks=self._max_text_tasks)
            finally:
                _PREPARING.reset(preparing)
            if prepared.samples > self._max_samples:
                raise InvalidRequest(
                    f"samples must lie in [1, {self._max_samples}] on this server, got {prepared.samples}"
                )
        except Exception as error:  # InvalidRequest: the client's fault; anything else: the server's
            answer(error)
            return None
        arrival = chunks.arrive()  # a refused request leaves the robot's earlier replies current
        if not self._warm:
            self._warm_up(prepared.arrays)
            received = time.perf_counter()  # the one-time compilation is no latency to plan a delay with
        frame_input = FrameInput(
            prepared.arrays, prepared.noise, guidance=prepared.guidance, samples=prepared.samples
        )
        with self._lock:
            robot = self._robot(request)
            index = robot.observations
            robot.observations += 1
            group = None
            if prepared.texts and all(other.done for other in robot.groups):
                group = _Group(index, [])
                for plan in prepared.texts:
                    speech = _Speech(next(self._request_ids), robot.robot_id, plan.task)
                    text = TextRequest(
                        speech.request_id,
                        plan.max_new_tokens,
                        temperature=plan.temperature,
                        top_p=plan.top_p,
                        seed=plan.seed,
                        on_tokens=functools.partial(self._on_tokens, speech),
                        on_done=functools.partial(self._on_done, speech),
                    )
                    if plan.task is None:
                        frame_input.requests.append(text)
                    else:
                        frame_input.tasks.append((text, list(plan.suffix)))
                    group.speeches.append(speech)
                robot.groups.append(group)

        def on_actions(reply: ActionReply) -> None:
            if reply.actions is not None and prepared.samples > 1:
                try:
                    reply = dataclasses.replace(reply, actions=self._policy.keep(prepared, reply.actions))
                except Exception as error:
                    logger.exception("choosing a chunk failed")
                    reply = dataclasses.replace(reply, actions=None, error=error)
            result = self._reply(request.client, robot, index, prepared, group, reply)
            if not isinstance(result, Exception):
                latency_s = time.perf_counter() - received
                result.update(chunks.answered(arrival, reply.actions, result["actions"], latency_s))
                result[protocol.START] = start
                if guidance is not None:
                    result["rtc_method"] = rtc_defaults.method(self._policy.engine.config.max_clean_prefix)
            answer(result)

        return ObservationWork(frame_input, on_actions, sender=request.client)

    def _robot(self, request: RobotRequest) -> _Robot:
        robot = self._robots.get(request.client)
        if robot is None:
            name = request.robot_id or f"robot-{next(self._robot_numbers)}"
            robot = self._robots[request.client] = _Robot(name)
        elif request.robot_id is not None:
            robot.robot_id = request.robot_id
        return robot

    def _reply(
        self,
        client: Hashable,
        robot: _Robot,
        index: int,
        prepared: PreparedRequest,
        group: _Group | None,
        reply: ActionReply,
    ) -> dict[str, Any] | Exception:
        """The robot's reply from its actions (output thread); a failed observation's language requests
        are withdrawn (they never joined: a batch joins all or none)."""
        if reply.error is not None:
            if group is not None:
                with self._lock:
                    if any(other is group for other in robot.groups):
                        robot.groups.remove(group)
            return reply.error
        started = None
        if group is not None:
            ids = {speech.task: speech.request_id for speech in group.speeches}
            started = ids.get(None, ids)
        try:
            speech, fields = self._text_fields(robot)
            outputs = self._policy.finish(prepared, reply.actions, speech)
        except Exception as error:
            logger.exception("finishing a reply failed")
            return error
        timing = {"infer_ms": reply.action_s * 1000, "queue_ms": reply.wait_s * 1000}
        return {
            **outputs,
            **fields,
            "robot_id": robot.robot_id,
            "observation_index": index,
            "text_request_started": started,
            "policy_timing": timing,
        }

    def _text_fields(self, robot: _Robot) -> tuple[dict[str | None, Speech] | None, dict[str, Any]]:
        """The text of the robot's oldest unreported group of language requests, and the fields that
        name it (which request, which observation, whether done)."""
        with self._lock:
            if not robot.groups:
                return None, {}
            group = robot.groups[0]
            done = group.done
            if done:
                robot.groups.pop(0)  # reported done once
            said = {speech.task: _speech(speech) for speech in group.speeches}
        fields = {"text_done": done, "text_observation_index": group.observation_index}
        if group.speeches[0].task is None:
            fields["text_request_id"] = group.speeches[0].request_id
        else:
            fields["text_request_ids"] = {speech.task: speech.request_id for speech in group.speeches}
        return said, fields

    def _on_tokens(self, speech: _Speech, _request_id: int, tokens: np.ndarray, text: str) -> None:
        with self._lock:
            speech.tokens.extend(tokens.tolist())
            speech.text = text
        self._publish(TextEvent(speech.robot_id, speech.request_id, speech.task, tokens, text, done=False))

    def _on_done(self, speech: _Speech, result: TextResult) -> None:
        with self._lock:
            new = result.tokens[len(speech.tokens) :]
            speech.result = result
        event = TextEvent(
            speech.robot_id, speech.request_id, speech.task, new, result.text, True, result.finish_reason
        )
        self._publish(event)

    def _publish(self, event: TextEvent) -> None:
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:
                logger.exception("a text listener failed")

    def _warm_up(self, example: dict[str, np.ndarray]) -> None:
        with self._warm_lock:  # a second first request waits until the shapes are compiled
            if not self._warm:
                self._runtime.warmup(example)
                self._warm = True


def _speech(speech: _Speech) -> Speech:
    """What a reply says of one request: all of its text once done, else its text so far."""
    if speech.result is not None:
        return Speech(speech.result.tokens, speech.result.text)
    return Speech(np.asarray(speech.tokens, np.int32), speech.text)
