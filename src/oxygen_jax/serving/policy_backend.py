"""The backends `scripts/serve.py` serves a `Policy` through: request options in, text fields out.

Besides the robot observation a request may carry `noise` ([H, action_dim], making that sample
deterministic), `max_text_tokens`, `temperature` and `top_p`; they are taken out before the robot
transforms see the observation. Bad requests raise ValueError, which the server answers as
"Bad request: ...".

- `PolicyServerBackend` (`--language=inline`): one request at a time, text decoded to completion within
  it; the reply adds `text`, `text_tokens` and `text_done` (always True). A request may carry
  `text_tasks` (name -> instruction, see `Policy.infer`): one prefill, and the reply's `texts` and
  `texts_tokens` hold one text per task name.
- `SessionServerBackend` (default): requests from all connections are grouped into frames of one
  `MultiRobotSession`, whose observations are prefilled together; each robot's language request advances
  k tokens per frame over its following requests. While a robot has one, its replies add `text` (the text
  so far), `text_tokens`, `text_done` and `text_request_id`; after the reply with `text_done` True, the
  robot's next request starts a new one from its observation. `max_text_tokens`, `temperature` and
  `top_p` apply to the language request a request starts.
"""

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from oxygen_jax.policies.policy import Policy
from oxygen_jax.runtime.session import MultiRobotSession, RobotRequest

REQUEST_OPTIONS = ("noise", "max_text_tokens", "temperature", "top_p")


def _option(value: Any, kind: type, name: str) -> Any:
    """A msgpack number as `kind` (an int option takes integers only), or a ValueError naming the field."""
    numbers = (int, np.integer) if kind is int else (int, float, np.integer, np.floating)
    if value is None:
        return None
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers):
        expected = "an integer" if kind is int else "a number"
        raise ValueError(f"{name!r}: expected {expected}, got {type(value).__name__}")
    return kind(value)


def _split_request(obs: dict) -> tuple[dict, dict[str, Any]]:
    """(the robot observation, the request options as `Policy.infer` keyword arguments)."""
    obs = dict(obs)
    noise, max_text_tokens, temperature, top_p = (obs.pop(name, None) for name in REQUEST_OPTIONS)
    options = {
        "noise": noise,
        "max_text_tokens": _option(max_text_tokens, int, "max_text_tokens"),
        "temperature": _option(temperature, float, "temperature"),
        "top_p": _option(top_p, float, "top_p"),
    }
    return obs, options


def _split_tasks(obs: dict) -> tuple[dict, Any]:
    """(the request without `text_tasks`, its `text_tasks` or None)."""
    obs = dict(obs)
    return obs, obs.pop("text_tasks", None)


class PolicyServerBackend:
    """The `PolicyBackend` the websocket server calls, one request at a time, around one Policy."""

    def __init__(self, policy: Policy) -> None:
        self._policy = policy

    @property
    def metadata(self) -> dict:
        return self._policy.metadata

    def infer(self, obs: dict) -> dict:
        obs, text_tasks = _split_tasks(obs)
        obs, options = _split_request(obs)
        result = self._policy.infer(obs, text_tasks=text_tasks, **options)
        if "text" in result:
            result["text_done"] = True
        return result


class SessionServerBackend:
    """An `AsyncPolicyBackend` that gathers the requests of all connections into session frames.

    A client is its connection (the server runs each one in its own task). A frame starts once every
    connected client has a request waiting, or `gather_ms` after the first waiting request arrived, and takes
    at most `session.max_batch` of them (the rest start the next frame). Frames run one at a time on a worker
    thread, so the event loop keeps receiving meanwhile. A client that disconnects has its language request
    cancelled before the next frame.
    """

    def __init__(self, session: MultiRobotSession, *, gather_ms: float = 5.0) -> None:
        self._session = session
        self._gather_s = gather_ms / 1000
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="frame-loop")
        self._waiting: list[tuple[RobotRequest, asyncio.Future]] = []
        self._clients: set[asyncio.Task] = set()
        self._departed: list[asyncio.Task] = []
        self._wake: asyncio.Event | None = None
        self._frames: asyncio.Task | None = None

    @property
    def metadata(self) -> dict:
        return self._session.metadata

    async def infer_async(self, obs: dict) -> dict:
        obs, text_tasks = _split_tasks(obs)
        if text_tasks is not None:
            raise ValueError("'text_tasks' are served with --language=inline (one prefill per request)")
        obs, options = _split_request(obs)
        client = asyncio.current_task()
        if client not in self._clients:
            self._clients.add(client)
            client.add_done_callback(self._depart)
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((RobotRequest(client, obs, **options), future))
        self._frame_loop().set()
        return await future

    def _frame_loop(self) -> asyncio.Event:
        """The wake-up event of this event loop's frame loop, which starts on the first request."""
        if self._frames is None or self._frames.done():  # a new server may run on a new event loop
            self._wake = asyncio.Event()
            self._frames = asyncio.create_task(self._run_frames())
        return self._wake

    def _depart(self, client: asyncio.Task) -> None:
        self._clients.discard(client)
        self._departed.append(client)
        if self._wake is not None:
            self._wake.set()

    async def _run_frames(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._waiting:
                continue
            await self._gather(loop)
            batch = self._waiting[: self._session.max_batch]
            del self._waiting[: len(batch)]
            batch = [(request, future) for request, future in batch if not future.done()]  # clients gone
            if self._waiting:
                self._wake.set()
            departed, self._departed = self._departed, []
            try:
                replies = await loop.run_in_executor(
                    self._worker, self._frame, [request for request, _ in batch], departed
                )
            except Exception as error:  # the whole frame failed: every request in it hears why
                replies = [error] * len(batch)
            for (_, future), reply in zip(batch, replies, strict=True):
                if future.done():  # its client went away during the frame
                    continue
                if isinstance(reply, Exception):
                    future.set_exception(reply)
                else:
                    future.set_result(reply)

    async def _gather(self, loop: asyncio.AbstractEventLoop) -> None:
        """Waits until every connected client has a request in, for at most the gather window."""
        deadline = loop.time() + self._gather_s
        while (remaining := deadline - loop.time()) > 0 and not self._clients <= {
            request.client for request, _ in self._waiting
        }:
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), remaining)

    def _frame(self, requests: list[RobotRequest], departed: list[asyncio.Task]) -> list:
        for client in departed:
            self._session.end(client)
        return self._session.step(requests)
