"""Several robots served by one Policy in one frame loop: actions per request, language across requests.

A frame takes the requests that arrived together (at most one per robot), runs each raw observation through
the Policy's input pipeline and prefills them all in one `FrameScheduler.step`. The prefix caches feed the
action expert and, for a robot without a language request in flight, a new language request prompted from
that observation, which joins the shared batch state. Every frame decodes k tokens for all running
requests, so a robot's text grows over its following requests. Each reply holds openpi's `actions` and,
while the robot has a language request, `text` (its text so far), `text_tokens`, `text_done` and
`text_request_id`; the reply that says `text_done` is the last for that request, and the robot's next
request starts a new one.

Actions equal `Policy.infer`'s with the same noise. The first frame compiles every shape steady state can
meet (`warmup`), so later frames never compile. Not thread-safe: call `step` and `end` from one thread.
"""

import dataclasses
import itertools
import logging
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from oxygen_jax.policies.policy import Policy
from oxygen_jax.runtime.k_policy import DeadlineK, FixedK
from oxygen_jax.runtime.manager import KVCacheManager
from oxygen_jax.runtime.requests import TextRequest, TextResult
from oxygen_jax.runtime.scheduler import FrameInput, FrameScheduler

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class RobotRequest:
    """One robot's raw observation with this request's options (as `Policy.infer` takes them).

    `client` names the robot: its language request lives across the requests that carry the same client.
    `max_text_tokens`, `temperature` and `top_p` apply to the language request this one starts, if it
    starts one; `max_text_tokens=0` starts none.
    """

    client: Hashable
    obs: Mapping[str, Any]
    noise: np.ndarray | None = None
    max_text_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None


class RequestError(ValueError):
    """Preparing one request failed with an unexpected exception (its `__cause__`): the request's fault."""


@dataclasses.dataclass
class _Speech:
    """A robot's current language request, fed by the manager's callbacks on the frame loop's thread."""

    request_id: int
    tokens: list[int] = dataclasses.field(default_factory=list)
    result: TextResult | None = None

    def on_tokens(self, _request_id: int, tokens: np.ndarray) -> None:
        self.tokens.extend(tokens.tolist())

    def on_done(self, result: TextResult) -> None:
        self.result = result


@dataclasses.dataclass
class _Prepared:
    """One checked request: its canonical arrays (batch dim 1), noise and, if it starts one, its language
    request."""

    index: int
    client: Hashable
    arrays: dict[str, np.ndarray]
    noise: np.ndarray | None
    text: TextRequest | None = None


class MultiRobotSession:
    """One Policy, a KV cache manager and a frame scheduler, shared by every connected robot."""

    def __init__(
        self,
        policy: Policy,
        k_policy: FixedK | DeadlineK,
        *,
        max_slots: int = 8,
        max_batch: int = 4,
        seed: int = 0,
    ) -> None:
        """max_slots: language requests decoded together (more wait in the admission queue);
        max_batch: observations prefilled together in one frame (a frame of more is refused)."""
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
        )
        self._rng = np.random.default_rng(seed)
        self._request_ids = itertools.count()
        self._speech: dict[Hashable, _Speech] = {}
        self._warm = False

    @property
    def max_batch(self) -> int:
        return self._scheduler.max_prefill_batch

    @property
    def metadata(self) -> dict[str, Any]:
        """The Policy's metadata, plus how this session streams text."""
        return {
            **self._policy.metadata,
            "text_stream": True,
            "max_slots": self._scheduler.manager.max_slots,
            "max_batch": self.max_batch,
        }

    def warmup(self, obs: Mapping[str, Any]) -> None:
        """Compiles every shape steady state can meet, on one raw observation of this robot (its masked
        cameras pick the prefill variant). `step` does this on its first frame when nobody did before."""
        self._warm_up(_batched(self._policy.model_inputs(obs)))

    def step(self, requests: Sequence[RobotRequest]) -> list[dict[str, Any] | Exception]:
        """One frame: per request its reply, or the exception that refused it.

        Each request is prepared on its own; whatever it raises is that request's answer (a ValueError
        naming what is wrong with it) and the frame goes on with the others. If the model call fails for
        the frame, each request is retried alone once, so only the one that fails again gets the error.
        A robot's language request is registered only once its frame succeeded.
        """
        if len(requests) > self.max_batch:
            raise ValueError(f"a frame takes at most {self.max_batch} requests, got {len(requests)}")
        replies: dict[int, dict[str, Any] | Exception] = {}
        prepared = []
        speaking = set(self._speech)
        for index, request in enumerate(requests):
            try:
                item = self._prepare(index, request, speaking)
            except Exception as error:
                replies[index] = _refusal(error)
                continue
            prepared.append(item)
        if prepared:
            if not self._warm:
                self._warm_up(prepared[0].arrays)
            try:
                replies.update(self._run(prepared))
            except Exception:
                logger.exception("a frame failed; its requests are retried one at a time")
                for item in prepared:
                    try:
                        replies.update(self._run([item]))
                    except Exception as error:
                        replies[item.index] = error
        return [replies[index] for index in range(len(requests))]

    def end(self, client: Hashable) -> None:
        """The robot left: its language request stops and frees its slot."""
        speech = self._speech.pop(client, None)
        if speech is not None and speech.result is None:
            self._scheduler.manager.cancel(speech.request_id, self._scheduler.frame)

    def _prepare(self, index: int, request: RobotRequest, speaking: set[Hashable]) -> _Prepared:
        """Checks the request and transforms its observation; a robot without a language request in
        flight (`speaking`, updated here) gets a new one on this observation."""
        budget = self._policy.text_budget(None, request.max_text_tokens)
        temperature = self._policy.text_temperature(request.temperature)
        top_p = self._policy.text_top_p(request.top_p)
        arrays = self._policy.model_inputs(request.obs)
        noise = None if request.noise is None else np.asarray(self._policy.action_noise(request.noise, 0))
        item = _Prepared(index, request.client, _batched(arrays), noise)
        if budget and request.client not in speaking:
            speaking.add(request.client)
            item.text = TextRequest(
                -1,  # each attempt to run it gets its own id (`_run`)
                budget,
                temperature=temperature,
                top_p=top_p,
                seed=int(self._rng.integers(2**31)),
            )
        return item

    def _run(self, prepared: list[_Prepared]) -> dict[int, dict[str, Any]]:
        """One scheduler step over `prepared`; registers their language requests once it succeeded."""
        speeches = {item.index: _Speech(next(self._request_ids)) for item in prepared if item.text}
        frame_inputs = []
        for item in prepared:
            frame_input = FrameInput(item.arrays, item.noise)
            if (speech := speeches.get(item.index)) is not None:
                frame_input.requests.append(
                    dataclasses.replace(
                        item.text,
                        request_id=speech.request_id,
                        on_tokens=speech.on_tokens,
                        on_done=speech.on_done,
                    )
                )
            frame_inputs.append(frame_input)
        try:
            frame = self._scheduler.step(frame_inputs)
        except Exception:
            for speech in speeches.values():  # the failed step may have queued them
                self._scheduler.manager.cancel(speech.request_id, self._scheduler.frame)
            raise
        for item in prepared:
            if item.index in speeches:
                self._speech[item.client] = speeches[item.index]
        timing = {"infer_ms": frame.action_s * 1000, "frame_ms": frame.total_s * 1000}
        replies = {}
        for item, actions in zip(prepared, frame.actions, strict=True):
            reply = self._policy.robot_outputs(item.arrays["state"][0], actions)
            replies[item.index] = {**reply, **self._text_fields(item.client), "policy_timing": timing}
        return replies

    def _text_fields(self, client: Hashable) -> dict[str, Any]:
        speech = self._speech.get(client)
        if speech is None:
            return {}
        done = speech.result is not None
        if done:
            del self._speech[client]  # reported done once; the next request starts a new one
            tokens, text = speech.result.tokens, speech.result.text
        else:
            tokens = np.asarray(speech.tokens, np.int32)
            text = self._policy.detokenize(tokens)
        return {"text": text, "text_tokens": tokens, "text_done": done, "text_request_id": speech.request_id}

    def _warm_up(self, example: dict[str, np.ndarray]) -> None:
        if self._scheduler.manager.max_slots:
            self._scheduler.warmup(example)
        else:  # language off: only the prefill batch sizes
            for size in range(1, self.max_batch + 1):
                self._scheduler.step([FrameInput(example)] * size)
        self._warm = True


def _refusal(error: Exception) -> ValueError:
    """A request's own error: ValueErrors name the problem already; anything else is logged and wrapped."""
    if isinstance(error, ValueError):
        return error
    logger.warning("request refused by an unexpected %s", type(error).__name__, exc_info=error)
    refusal = RequestError(f"{type(error).__name__}: {' '.join(str(error).split())}")
    refusal.__cause__ = error
    return refusal


def _batched(arrays: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {key: np.asarray(value)[None] for key, value in arrays.items()}
