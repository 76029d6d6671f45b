"""Several robots served by one Policy on one device loop: actions per request, language across requests.

Each robot request is checked and transformed on its own, on the caller's thread; its observation then goes
to the `DeviceLoop`, which prefills it together with whatever other robots' observations wait and hands
each robot its actions the moment they are on the host. A robot without a language request in flight
starts one on that observation; it joins the shared batch state and decodes in the device's idle time
(`loop="async"`) or k tokens per frame before the frame's replies (`loop="frame"`, the paper's loop).

A reply holds openpi's `actions`, the robot's `robot_id` and, while the robot has a language request to
report, `text` (its text so far), `text_tokens`, `text_done` and `text_request_id`. A reply reports the
robot's oldest unreported request, and the reply that says `text_done` is the last for that request. A
request that finished between two observations lets the next observation start a new one at once (that
reply reports the finished one; the new one shows from the following reply on).

A request with `text_tasks` (see `policies.text_tasks`) starts one language request per task instead, each
decoding after its instruction appended to the observation's prefix (`FrameScheduler`, one extension call
per batch); its replies carry `texts` and `texts_tokens` (task name -> text so far), `text_done` (every
task finished) and `text_request_ids` (task name -> request id).

`subscribe` pushes a `TextEvent` for every chunk of new tokens and every finished request as the device
thread produces them. Actions equal `Policy.infer`'s with the same noise. The first request compiles every
shape steady state can meet (`warmup`), so later ones never compile.
"""

import concurrent.futures
import dataclasses
import itertools
import logging
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from oxygen_jax.errors import InvalidRequest
from oxygen_jax.policies.policy import MAX_TASK_TOKENS, PlannedTask, Policy
from oxygen_jax.runtime.device_loop import ActionReply, DeviceLoop, ObservationWork
from oxygen_jax.runtime.k_policy import KPolicy
from oxygen_jax.runtime.manager import KVCacheManager
from oxygen_jax.runtime.requests import TextRequest, TextResult
from oxygen_jax.runtime.scheduler import FrameInput, FrameScheduler

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class RobotRequest:
    """One robot's raw observation with this request's options (as `Policy.infer` takes them).

    `client` names the robot: its language request lives across the requests that carry the same client.
    `robot_id` labels it in replies and text events (default `robot-<n>`, kept from its first request).
    `max_text_tokens`, `temperature` and `top_p` apply to the language request this one starts, if it
    starts one; `max_text_tokens=0` starts none.
    """

    client: Hashable
    obs: Mapping[str, Any]
    noise: np.ndarray | None = None
    max_text_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    robot_id: str | None = None
    text_tasks: Any = None


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
    """A robot's language request, fed by the manager's callbacks on the device thread."""

    request_id: int
    robot_id: str
    task: str | None = None
    tokens: list[int] = dataclasses.field(default_factory=list)
    result: TextResult | None = None


class MultiRobotSession:
    """One Policy, a KV cache manager, a frame scheduler and the device loop, shared by every robot."""

    def __init__(
        self,
        policy: Policy,
        k_policy: KPolicy,
        *,
        max_slots: int = 8,
        max_batch: int = 4,
        seed: int = 0,
        loop: str = "async",
        gather_s: float = 0.0,
        max_text_tasks: int = 0,
        owed_k: int | None = None,
    ) -> None:
        """max_slots: language requests decoded together (more wait in the admission queue);
        max_batch: observations prefilled together; loop: "async" or "frame" (`DeviceLoop` modes);
        gather_s: how long a first waiting observation waits for the other known robots' ones;
        max_text_tasks: the most `text_tasks` one request may carry (0: none; else the batch state
        reserves room for a task's instruction and warm-up compiles the extension shapes); owed_k: the
        async loop's decode steps between two batches of observations (`DeviceLoop`)."""
        self._policy = policy
        language = policy.max_text_tokens > 0
        # The session is `Policy.infer` batched over robots: it reuses the Policy's own transforms, tokenizer,
        # noise and text-option checks rather than copies of them.
        manager = KVCacheManager(
            policy.engine, max_slots if language else 0, policy.max_text_tokens, policy.detokenize
        )
        self._scheduler = FrameScheduler(
            policy.engine,
            manager,
            k_policy,
            num_steps=policy.num_steps,
            max_prefill_batch=max_batch,
            seed=seed,
            task_suffix_len=MAX_TASK_TOKENS if max_text_tasks and language else 0,
            max_frame_tasks=max_batch * max_text_tasks,
        )
        self._max_text_tasks = max_text_tasks if language else 0
        self._loop = DeviceLoop(
            self._scheduler,
            mode=loop,
            gather_s=gather_s,
            expected_senders=lambda: len(self._robot_ids),
            owed_k=owed_k,
        )
        self._lock = threading.Lock()
        self._rng = np.random.default_rng(seed)
        self._request_ids = itertools.count()
        self._robot_numbers = itertools.count()
        self._robot_ids: dict[Hashable, str] = {}
        # Per robot, its language requests to report, oldest first: one group per observation that started
        # some (one request, or one per text task).
        self._speech: dict[Hashable, list[list[_Speech]]] = {}
        self._listeners: tuple[Callable[[TextEvent], None], ...] = ()
        self._warm = False

    @property
    def max_batch(self) -> int:
        return self._scheduler.max_prefill_batch

    @property
    def device_loop(self) -> DeviceLoop:
        return self._loop

    @property
    def metadata(self) -> dict[str, Any]:
        """The Policy's metadata, plus how this session streams text."""
        return {
            **self._policy.metadata,
            "text_stream": True,
            "loop": self._loop.mode,
            "max_slots": self._scheduler.manager.max_slots,
            "max_batch": self.max_batch,
            "max_text_tasks": self._max_text_tasks,
        }

    def start(self) -> "MultiRobotSession":
        """Starts the device loop (`submit` and `step` start it when needed)."""
        with self._lock:
            if not self._loop.running:
                self._loop.start()
        return self

    def stop(self) -> None:
        """Answers every observation already received, then stops the device loop."""
        if self._loop.running:
            self._loop.stop()

    def warmup(self, obs: Mapping[str, Any]) -> None:
        """Compiles every shape steady state can meet, on one raw observation of this robot (its masked
        cameras pick the prefill variant). The first request does this when nobody did before."""
        arrays = _batched(self._policy.model_inputs(obs))
        done = concurrent.futures.Future()
        self._on_device(lambda: done.set_result(self._warm_up(arrays)))
        done.result()

    def subscribe(self, listener: Callable[[TextEvent], None]) -> Callable[[], None]:
        """Calls `listener(event)` on the device thread for every text event; returns the unsubscribe."""
        with self._lock:
            self._listeners += (listener,)

        def unsubscribe() -> None:
            with self._lock:
                self._listeners = tuple(other for other in self._listeners if other is not listener)

        return unsubscribe

    def submit(self, request: RobotRequest, answer: Answer) -> None:
        """Queues one request (any thread). `answer` gets its reply or the exception that refused it: at
        once for a request that fails its checks, else on the device thread once its actions are ready."""
        work = self._work(request, answer)
        if work is not None:
            self.start()._loop.submit(work)

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
            self.start()._loop.submit(*works)
        return [future.result() for future in futures]

    def end(self, client: Hashable) -> None:
        """The robot left: its waiting observations are dropped and its language requests stop, freeing
        their slots (on the device thread, before its next piece of work)."""

        def leave() -> None:
            self._loop.withdraw(client)
            with self._lock:
                groups = self._speech.pop(client, [])
                self._robot_ids.pop(client, None)
            for speech in (speech for group in groups for speech in group):
                if speech.result is None:
                    self._scheduler.manager.cancel(speech.request_id, self._scheduler.frame)

        self._on_device(leave)

    def _on_device(self, fn: Callable[[], None]) -> None:
        """Runs `fn` on the device thread (or here, while the loop is not running)."""
        if self._loop.running:
            self._loop.call(fn)
        else:
            fn()

    def _work(self, request: RobotRequest, answer: Answer) -> ObservationWork | None:
        """Checks and transforms one request; a robot without a language request in flight starts one on
        this observation. None (and the refusal answered) when the request fails its checks."""
        try:
            budget = self._policy.text_budget(None, request.max_text_tokens)
            temperature = self._policy.text_temperature(request.temperature)
            top_p = self._policy.text_top_p(request.top_p)
            tasks = self._tasks(request, budget)
            arrays = _batched(self._policy.model_inputs(request.obs))
            noise = None if request.noise is None else np.asarray(self._policy.action_noise(request.noise, 0))
        except Exception as error:  # InvalidRequest: the client's fault; anything else: the server's
            answer(error)
            return None
        frame_input = FrameInput(arrays, noise)
        with self._lock:
            robot_id = self._robot_id(request)
            groups = self._speech.setdefault(request.client, [])
            group: list[_Speech] = []
            if budget and all(speech.result is not None for other in groups for speech in other):
                for task in tasks or [None]:
                    speech = _Speech(next(self._request_ids), robot_id, None if task is None else task.name)
                    text = TextRequest(
                        speech.request_id,
                        budget if task is None else task.max_new_tokens,
                        temperature=temperature if task is None else task.temperature,
                        top_p=top_p,
                        seed=int(self._rng.integers(2**31)),
                        on_tokens=lambda _id, tokens, speech=speech: self._on_tokens(speech, tokens),
                        on_done=lambda result, speech=speech: self._on_done(speech, result),
                    )
                    if task is None:
                        frame_input.requests.append(text)
                    else:
                        frame_input.tasks.append((text, task.suffix))
                    group.append(speech)
                groups.append(group)
        if not self._warm:
            self._on_device(lambda: self._warm or self._warm_up(arrays))

        def on_actions(reply: ActionReply) -> None:
            answer(self._reply(request.client, robot_id, arrays["state"][0], group, reply))

        return ObservationWork(frame_input, on_actions, sender=request.client)

    def _tasks(self, request: RobotRequest, budget: int) -> list[PlannedTask]:
        """The request's text tasks, checked (none without `text_tasks`)."""
        if request.text_tasks is None:
            return []
        if not self._max_text_tasks:
            raise InvalidRequest("text_tasks: this server takes none (start it with --max_text_tasks > 0)")
        tasks = self._policy.plan_text_tasks(request.text_tasks, request.max_text_tokens, request.temperature)
        if len(tasks) > self._max_text_tasks:
            raise InvalidRequest(f"text_tasks: at most {self._max_text_tasks} tasks, got {len(tasks)}")
        return tasks if budget else []

    def _robot_id(self, request: RobotRequest) -> str:
        known = self._robot_ids.get(request.client)
        if request.robot_id is not None:
            self._robot_ids[request.client] = request.robot_id
        elif known is None:
            self._robot_ids[request.client] = f"robot-{next(self._robot_numbers)}"
        return self._robot_ids[request.client]

    def _reply(
        self, client: Hashable, robot_id: str, state: np.ndarray, group: list[_Speech], reply: ActionReply
    ) -> dict[str, Any] | Exception:
        """The robot's reply from its actions (device thread); a failed observation's language requests
        are withdrawn (they never joined: a batch joins all or none)."""
        if reply.error is not None:
            if group:
                with self._lock:
                    groups = self._speech.get(client, [])
                    if any(other is group for other in groups):
                        groups.remove(group)
            return reply.error
        try:
            outputs = self._policy.robot_outputs(state, reply.actions)
        except Exception as error:
            logger.exception("robot outputs failed")
            return error
        timing = {"infer_ms": reply.action_s * 1000, "queue_ms": reply.wait_s * 1000}
        return {**outputs, **self._text_fields(client), "robot_id": robot_id, "policy_timing": timing}

    def _text_fields(self, client: Hashable) -> dict[str, Any]:
        """The fields of the robot's oldest unreported group of language requests."""
        with self._lock:
            groups = self._speech.get(client)
            if not groups:
                return {}
            group = groups[0]
            done = all(speech.result is not None for speech in group)
            if done:
                groups.pop(0)  # reported done once
        texts = {speech.task: self._text_so_far(speech) for speech in group}
        if group[0].task is None:
            (text, tokens), request_id = texts[None], group[0].request_id
            return {"text": text, "text_tokens": tokens, "text_done": done, "text_request_id": request_id}
        return {
            "texts": {name: text for name, (text, _) in texts.items()},
            "texts_tokens": {name: tokens for name, (_, tokens) in texts.items()},
            "text_done": done,
            "text_request_ids": {speech.task: speech.request_id for speech in group},
        }

    def _text_so_far(self, speech: _Speech) -> tuple[str, np.ndarray]:
        if speech.result is not None:
            return speech.result.text, speech.result.tokens
        tokens = np.asarray(speech.tokens, np.int32)
        return self._policy.detokenize(tokens), tokens

    def _on_tokens(self, speech: _Speech, tokens: np.ndarray) -> None:
        speech.tokens.extend(tokens.tolist())
        if self._listeners:
            text = self._policy.detokenize(np.asarray(speech.tokens, np.int32))
            self._publish(
                TextEvent(speech.robot_id, speech.request_id, speech.task, tokens, text, done=False)
            )

    def _on_done(self, speech: _Speech, result: TextResult) -> None:
        with self._lock:
            speech.result = result
        new = result.tokens[len(speech.tokens) :]
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
        if self._scheduler.manager.max_slots:
            self._scheduler.warmup(example)
        else:  # language off: only the prefill batch sizes
            for size in range(1, self.max_batch + 1):
                self._scheduler.step([FrameInput(example)] * size)
        self._warm = True


def _batched(arrays: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {key: np.asarray(value)[None] for key, value in arrays.items()}
