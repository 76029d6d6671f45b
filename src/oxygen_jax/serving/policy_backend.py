"""The backends `scripts/serve.py` serves a `Policy` through: request options in, text fields out.

Besides the robot observation a request may carry `noise` ([H, action_dim], or [samples, H, action_dim],
making the sample deterministic), `samples` (action chunks drawn from its one prefill, the densest kept:
`Policy.keep`, on both backends), `max_text_tokens`, `temperature`, `top_p` and `robot_id` (the robot's name
in replies and the text stream); they are taken out before the robot transforms see the observation. Every
request is checked whole against the server's `RequestSchema` (`serving/request_schema.py`) before any work
on it; bad requests raise `InvalidRequest`, which the server answers as "Bad request: ..."; anything else is
a server fault.

- `PolicyServerBackend` (`--language=inline`): one request at a time, text decoded to completion within
  it; the reply adds `text`, `text_tokens` and `text_done` (always True). A request may carry
  `text_tasks` (name -> instruction, see `Policy.infer`): one prefill, and the reply's `texts` and
  `texts_tokens` hold one text per task name.
- `SessionServerBackend` (default): every connection is a robot of one `MultiRobotSession`, whose device
  loop prefills the observations that wait together and decodes all robots' language requests in one
  batch state (see `serving/session.py` for the reply's text fields). `max_text_tokens`, `temperature`
  and `top_p` apply to the language request a request starts, and `text_tasks` makes it one request per
  task (with a session that takes them). A request may carry `rtc` (real-time chunking, the `rtc`
  protocol of `client/protocol.py`): its reply is guided towards the connection's last chunk, and every
  reply carries `chunk_id`, `start` and `stale`; a bad `rtc` is a bad request of that robot only.
  `PolicyServerBackend` refuses `rtc` (it keeps no per-connection state).

Both trim a request as soon as the server decoded it (`trim_request`: keys the schema does not read keep
only their names), so an unread array is not held while the request waits. Both are `ready` (the server's
`/readyz`) once `warmup` compiled every program, or once the first request
did; both keep Prometheus `metrics` (`serving/metrics.py`; `metrics=False`: none). `replica_id` (a replica
of a fleet, `serving/ray_app.py`) joins the metadata each client receives on connect.
"""

import asyncio
import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from oxygen_jax.policies.policy import Policy
from oxygen_jax.serving.metrics import ServerMetrics
from oxygen_jax.serving.request_schema import RequestSchema
from oxygen_jax.serving.session import MultiRobotSession, RobotRequest, TextEvent

INLINE_RTC_REFUSAL = "rtc: real-time chunking needs the streaming server (--language=stream)"


def _with_replica(metadata: Mapping[str, Any], replica_id: str | None) -> dict:
    return dict(metadata) if replica_id is None else {**metadata, "replica_id": replica_id}


class PolicyServerBackend:
    """The `PolicyBackend` the websocket server calls, one request at a time, around one Policy."""

    def __init__(self, policy: Policy, *, metrics: bool = True, replica_id: str | None = None) -> None:
        self._policy = policy
        self._schema = RequestSchema(policy, rtc_refusal=INLINE_RTC_REFUSAL)
        self._replica_id = replica_id
        self._lock = threading.Lock()  # warm-up and requests take turns: a Policy need not be thread-safe
        self._ready = False
        self.metrics = ServerMetrics(self.metadata) if metrics else None
        if self.metrics is not None:
            self.metrics.watch(lambda: self.metrics.readiness(self._ready))

    @property
    def metadata(self) -> dict:
        return _with_replica(self._policy.metadata, self._replica_id)

    @property
    def ready(self) -> bool:
        return self._ready

    def warmup(self, obs: Mapping[str, Any] | None = None) -> None:
        """Compiles what a request runs, on `obs` (default: the robot's blank observation)."""
        with self._lock:
            self._policy.warmup(self._policy.io.spec.example() if obs is None else obs)
            self._ready = True
        if self.metrics is not None:
            self.metrics.warmed_up()

    def trim_request(self, request: dict) -> dict:
        """What the server keeps of a decoded request (`RequestSchema.trimmed`)."""
        return self._schema.trimmed(request)

    def infer(self, obs: dict) -> dict:
        request = self._schema.check(obs)
        with self._lock:
            result = self._policy.infer(request.obs, **vars(request.options))
            self._ready = True
        if "text" in result:
            result["text_done"] = True
        return result


class SessionServerBackend:
    """An `AsyncPolicyBackend` that serves every connection as one robot of a `MultiRobotSession`.

    Requests are prepared on a pool of `prepare_workers` threads (default: one per core, at least two), so
    one robot's expensive preparation (large images, a long prompt) never holds up another robot's, then
    queued on the session's runtime; each reply is finished and sent as soon as its actions are on the
    host. A connection has one request in flight at a time, so a robot takes at most one worker. A client
    that disconnects has its waiting observations dropped and its language request cancelled, which frees
    its slot. `subscribe_text` feeds the server's `/text` stream.
    """

    def __init__(
        self,
        session: MultiRobotSession,
        *,
        prepare_workers: int | None = None,
        metrics: bool = True,
        replica_id: str | None = None,
    ) -> None:
        self._session = session
        self._replica_id = replica_id
        workers = prepare_workers or max(2, os.cpu_count() or 1)
        self._prepare = ThreadPoolExecutor(workers, thread_name_prefix="prepare")
        self._clients: set[asyncio.Task] = set()
        self.metrics = ServerMetrics(self.metadata) if metrics else None
        if self.metrics is not None:
            self._watch(self.metrics)

    @property
    def metadata(self) -> dict:
        return _with_replica(self._session.metadata, self._replica_id)

    @property
    def ready(self) -> bool:
        return self._session.warm

    def warmup(self, obs: Mapping[str, Any] | None = None) -> None:
        """Compiles every program (`MultiRobotSession.warmup`)."""
        self._session.warmup(obs)
        if self.metrics is not None:
            self.metrics.warmed_up()

    def trim_request(self, request: dict) -> dict:
        """What the server keeps of a decoded request (`RequestSchema.trimmed`)."""
        return self._session.schema.trimmed(request)

    async def infer_async(self, obs: dict) -> dict:
        client = asyncio.current_task()
        if client not in self._clients:
            self._clients.add(client)
            client.add_done_callback(self._depart)
        loop = asyncio.get_running_loop()
        reply = loop.create_future()

        def answer(result: dict | Exception) -> None:
            loop.call_soon_threadsafe(_settle, reply, result)

        def submit() -> None:  # on a prepare thread: checking a request is work too (its images)
            request = self._session.schema.check(obs)
            robot = RobotRequest(client, request.obs, request.options, request.robot_id, request.rtc)
            self._session.submit(robot, answer)

        await loop.run_in_executor(self._prepare, submit)
        return await reply

    def subscribe_text(self, listener: Callable[[dict], None]) -> Callable[[], None]:
        """Calls `listener` (on the runtime's output thread) with one message per text event; returns the
        unsubscribe."""
        return self._session.subscribe(lambda event: listener(text_message(event)))

    def close(self) -> None:
        """Answers what the runtime holds, then stops it."""
        self._prepare.shutdown()
        self._session.stop()

    def _watch(self, metrics: ServerMetrics) -> None:
        """Feeds `metrics` from the session's device loop and text events, and from its state when scraped."""
        session, runtime = self._session, self._session.runtime
        runtime.observe(metrics)
        session.subscribe(lambda event: metrics.text_event(len(event.tokens), event.finish_reason))
        metrics.watch(
            lambda: {
                **metrics.readiness(session.warm),
                "oxygen_slots_in_use": runtime.manager.active,
                "oxygen_slots_max": runtime.manager.max_slots,
                "oxygen_observations_waiting": runtime.waiting,
                "oxygen_device_busy_fraction": runtime.stats.busy_fraction() if runtime.running else 0.0,
                "oxygen_connected_robots": len(self._clients),
            }
        )

    def _depart(self, client: asyncio.Task) -> None:
        self._clients.discard(client)
        self._session.end(client)


def text_message(event: TextEvent) -> dict:
    """A text event as the `/text` stream sends it."""
    return {
        "robot_id": event.robot_id,
        "request_id": event.request_id,
        "task": event.task,
        "tokens": np.asarray(event.tokens, np.int32),
        "text": event.text,
        "done": event.done,
        "finish_reason": event.finish_reason,
    }


def _settle(future: asyncio.Future, result: dict | Exception) -> None:
    if future.done():  # its client went away meanwhile
        return
    if isinstance(result, Exception):
        future.set_exception(result)
    else:
        future.set_result(result)
