"""Many robots on one Policy and one shared runtime: actions per request, language across requests.

Each robot is a `Robot` (`robots/robot.py`) and each of its requests takes the robot's one sequence:
`Robot.prepare` on the caller's thread (checks, transforms, tokenizing, text tasks, `rtc` guidance), the
shared `Runtime` (its device loop prefills the observation together with whatever other robots'
observations wait), then `Robot.finish` on the runtime's output thread the moment its actions are on the
host. This is the transport-free half of a server: `serving/` only moves bytes to and from it.

A robot without a language request in flight starts one on that observation; it joins the shared batch
state and decodes in the device's idle time (`loop="async"`) or k tokens per frame before the frame's
replies (`loop="frame"`, the paper's loop). Besides the fields every `Robot` reply holds, while the robot
has a language request to report a reply also holds `text` (its text so far), `text_tokens`, `text_done`,
`text_request_id` and `text_observation_index`: which request that text is and which of the robot's
observations it describes. A reply reports the robot's oldest unreported request, and the reply that says
`text_done` is the last for that request, so a text may describe an earlier observation than the reply's
own.

A request with `text_tasks` (see `policies.text_tasks`) starts one language request per task instead, each
decoding after its instruction appended to the observation's prefix (one extension call per batch); its
replies carry `texts` and `texts_tokens` (task name -> text so far), `text_done` (every task finished)
and `text_request_ids` (task name -> request id).

Real-time chunking (`rtc` protocol, `robots/chunks.py`): each robot keeps its last chunk (`RobotChunks`);
a request with an `rtc` entry is guided towards that chunk aligned by the actions the robot executed, as
the robot executes it expressed in the request's model space (`Policy.prepare`), in the same batch as
everyone else's (the batch runs the guided program once, other rows plain). A bad `rtc` is that
request's `InvalidRequest`. An
`rtc` without `delay` gets the robot's last latency (receipt to reply) in control steps of its stated
`control_hz`.

A request may draw several action chunks (`samples`, up to the session's `max_samples`): they denoise on
its one prefill (`FrameScheduler`) and the reply keeps the densest, as `Policy.infer` does (`Policy.finish`).

`subscribe` pushes a `TextEvent` for every chunk of new tokens and every finished request, from the
output thread. Actions equal `Policy.infer`'s with the same noise. The first request compiles every shape
steady state can meet (`warmup`), so later ones never compile.
"""

import concurrent.futures
import dataclasses
import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from oxygen_jax.errors import InvalidRequest
from oxygen_jax.policies import rtc_defaults
from oxygen_jax.policies.policy import MAX_SAMPLES, MAX_TASK_TOKENS, Policy
from oxygen_jax.policies.request_options import RequestOptions
from oxygen_jax.robots.robot import Robot, RobotRequest, Roster, Turn
from oxygen_jax.robots.speech import LanguageRequest, TextEvent
from oxygen_jax.runtime import runtime
from oxygen_jax.runtime.device_loop import ActionReply, ObservationWork
from oxygen_jax.runtime.inline import TextPlan
from oxygen_jax.runtime.requests import TextRequest, TextResult
from oxygen_jax.runtime.runtime import Runtime, RuntimeConfig
from oxygen_jax.runtime.scheduler import FrameInput

logger = logging.getLogger(__name__)
NO_RTC = "rtc: this server does not take real-time-chunking requests"
Answer = Callable[[dict[str, Any] | Exception], None]


class Robots:
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
        self._robots = Roster(lambda name: Robot(policy, name))
        self._listeners: tuple[Callable[[TextEvent], None], ...] = ()
        self._warm = False

    @property
    def policy(self) -> Policy:
        return self._policy

    @property
    def rtc(self) -> bool:
        """Whether requests may carry `rtc`."""
        return self._rtc

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

    def start(self) -> "Robots":
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
        robot = self._robots.pop(client)
        if robot is None or not self._runtime.running:
            return
        self._runtime.withdraw(client)
        for request in robot.language_requests():
            if request.result is None:
                self._runtime.cancel(request.request_id)

    def _work(self, request: RobotRequest, answer: Answer) -> ObservationWork | None:
        """The robot's request on the shared runtime; None (and the refusal answered) when it fails its
        checks. A robot without a language request in flight starts one on this observation."""
        robot = self._robots.get(request.client, request.robot_id)
        try:
            if request.rtc is not None and not self._rtc:
                raise InvalidRequest(NO_RTC)
            turn = robot.prepare(
                request.obs,
                request.options,
                request.rtc,
                max_tasks=self._max_text_tasks,
                max_samples=self._max_samples,
            )
        except Exception as error:  # InvalidRequest: the client's fault; anything else: the server's
            answer(error)
            return None
        if not self._warm:
            self._warm_up(turn.prepared.arrays)
            turn.received = time.perf_counter()  # the one-time compilation is no latency to plan with
        prepared = turn.prepared
        frame_input = FrameInput(
            prepared.arrays, prepared.noise, guidance=prepared.guidance, samples=prepared.samples
        )

        def start_text(robot: Robot, plan: TextPlan) -> LanguageRequest:
            said = LanguageRequest(next(self._request_ids), robot.robot_id, plan.task)
            text = TextRequest(
                said.request_id,
                plan.max_new_tokens,
                temperature=plan.temperature,
                top_p=plan.top_p,
                seed=plan.seed,
                on_tokens=functools.partial(self._on_tokens, robot, said),
                on_done=functools.partial(self._on_done, robot, said),
            )
            if plan.task is None:
                frame_input.requests.append(text)
            else:
                frame_input.tasks.append((text, list(plan.suffix)))
            return said

        robot.begin(turn, start_text)

        def on_actions(reply: ActionReply) -> None:
            answer(self._reply(robot, turn, reply))

        return ObservationWork(frame_input, on_actions, sender=request.client)

    def _reply(self, robot: Robot, turn: Turn, reply: ActionReply) -> dict[str, Any] | Exception:
        """The robot's reply from its actions (output thread), or the error that lost them."""
        if reply.error is not None:
            robot.failed(turn)
            return reply.error
        timing = {"infer_ms": reply.action_s * 1000, "queue_ms": reply.wait_s * 1000}
        try:
            return robot.finish(turn, reply.actions, timing)
        except Exception as error:
            logger.exception("finishing a reply failed")
            return error

    def _on_tokens(
        self, robot: Robot, said: LanguageRequest, _request_id: int, tokens: np.ndarray, text: str
    ) -> None:
        with robot.lock:
            said.tokens.extend(tokens.tolist())
            said.text = text
        self._publish(TextEvent(said.robot_id, said.request_id, said.task, tokens, text, done=False))

    def _on_done(self, robot: Robot, said: LanguageRequest, result: TextResult) -> None:
        with robot.lock:
            new = result.tokens[len(said.tokens) :]
            said.result = result
        event = TextEvent(
            said.robot_id, said.request_id, said.task, new, result.text, True, result.finish_reason
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
