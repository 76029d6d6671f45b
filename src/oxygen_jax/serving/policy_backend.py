"""The backends `scripts/serve.py` serves a `Policy` through: request options in, text fields out.

Besides the robot observation a request may carry `noise` ([H, action_dim], or [samples, H, action_dim],
making the sample deterministic), `samples` (action chunks drawn from its one prefill, the densest kept:
`Policy.finish`, on both backends), `max_text_tokens`, `temperature`, `top_p` and `robot_id` (the robot's name
in replies and the text stream); they are taken out before the robot transforms see the observation. Every
request is checked whole against the server's `RequestSchema` (`serving/request_schema.py`) before any work
on it; bad requests raise `InvalidRequest`, which the server answers as "Bad request: ..."; anything else is
a server fault.

Every connection is one robot (`robots.Robot`): its requests take the robot's one sequence on either
backend, so a request may carry `rtc` (real-time chunking, the `rtc` protocol of `client/protocol.py`:
its reply continues the connection's last chunk; a bad `rtc` is a bad request of that robot only) and
`samples` alike, and every reply carries the robot's fields (`robot_id`, `observation_index`, `chunk_id`,
`start`, `stale`, ...; `robots/robot.py`).

- `PolicyServerBackend` (`--language=inline`): one request at a time on the policy's inline runtime
  (`robots.local.run_inline`), text decoded to completion within it; the reply adds `text`, `text_tokens`
  and `text_done` (always True). A request may carry `text_tasks` (name -> instruction, see
  `Policy.infer`): one prefill, and the reply's `texts` and `texts_tokens` hold one text per task name.
- `SessionServerBackend` (default): the robots of one `Robots`, whose device loop prefills the
  observations that wait together and decodes all robots' language requests in one batch state (see
  `robots/robots.py` for the reply's text fields). `max_text_tokens`, `temperature` and `top_p` apply to
  the language request a request starts, and `text_tasks` makes it one request per task (with robots that
  take them).

Both trim a request as soon as the server decoded it (`trim_request`: keys the schema does not read keep
only their names), so an unread array is not held while the request waits. Both are `ready` (the server's
`/readyz`) once `warmup` compiled every program, or once the first request
did; both keep Prometheus `metrics` (`serving/metrics.py`; `metrics=False`: none). `replica_id` (a replica
of a fleet, `serving/ray_app.py`) joins the metadata each client receives on connect.
"""

import asyncio
import gc
import os
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from oxygen_jax.policies.policy import Policy
from oxygen_jax.robots.local import run_inline
from oxygen_jax.robots.robot import Robot, RobotRequest, Roster
from oxygen_jax.robots.robots import NO_RTC, Robots
from oxygen_jax.robots.speech import TextEvent
from oxygen_jax.serving.metrics import ServerMetrics
from oxygen_jax.serving.request_schema import RequestSchema


def _with_replica(metadata: Mapping[str, Any], replica_id: str | None) -> dict:
    return dict(metadata) if replica_id is None else {**metadata, "replica_id": replica_id}


class PolicyServerBackend:
    """The `AsyncPolicyBackend` the websocket server calls around one Policy: every connection a robot,
    one request at a time on a worker thread (warm-up included: a Policy need not be thread-safe)."""

    def __init__(self, policy: Policy, *, metrics: bool = True, replica_id: str | None = None) -> None:
        self._policy = policy
        self._schema = RequestSchema(policy)
        self._replica_id = replica_id
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="inline")
        self._robots = Roster(lambda name: Robot(policy, name))
        self._clients: set[asyncio.Task] = set()
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
        obs = self._policy.io.spec.example() if obs is None else obs
        self._worker.submit(self._policy.warmup, obs).result()
        self._ready = True
        if self.metrics is not None:
            self.metrics.warmed_up()

    def trim_request(self, request: dict) -> dict:
        """What the server keeps of a decoded request (`RequestSchema.trimmed`)."""
        return self._schema.trimmed(request)

    async def infer_async(self, obs: dict) -> dict:
        client = _connected(asyncio.current_task(), self._clients, self._robots.pop)
        result = await asyncio.get_running_loop().run_in_executor(self._worker, self._infer, client, obs)
        self._ready = True
        if "text" in result:
            result["text_done"] = True
        return result

    def close(self) -> None:
        self._worker.shutdown()

    def _infer(self, client: asyncio.Task, obs: dict) -> dict:
        request = self._schema.check(obs)
        robot = self._robots.get(client, request.robot_id)
        return run_inline(robot, robot.prepare(request.obs, request.options, request.rtc))


class SessionServerBackend:
    """An `AsyncPolicyBackend` that serves every connection as one robot of `Robots`.

    Requests are prepared on a pool of `prepare_workers` threads (default: one per core, at least two), so
    one robot's expensive preparation (large images, a long prompt) never holds up another robot's, then
    queued on the session's runtime; each reply is finished and sent as soon as its actions are on the
    host. A connection has one request in flight at a time, so a robot takes at most one worker. A client
    that disconnects has its waiting observations dropped and its language request cancelled, which frees
    its slot. `subscribe_text` feeds the server's `/text` stream.
    """

    def __init__(
        self,
        session: Robots,
        *,
        prepare_workers: int | None = None,
        metrics: bool = True,
        replica_id: str | None = None,
    ) -> None:
        self._session = session
        self._schema = RequestSchema(session.policy, rtc_refusal=None if session.rtc else NO_RTC)
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
        """Compiles every program (`Robots.warmup`)."""
        self._session.warmup(obs)
        if self.metrics is not None:
            self.metrics.warmed_up()

    def trim_request(self, request: dict) -> dict:
        """What the server keeps of a decoded request (`RequestSchema.trimmed`)."""
        return self._schema.trimmed(request)

    async def infer_async(self, obs: dict) -> dict:
        client = _connected(asyncio.current_task(), self._clients, self._session.end)
        loop = asyncio.get_running_loop()
        reply = loop.create_future()

        def answer(result: dict | Exception) -> None:
            loop.call_soon_threadsafe(_settle, reply, result)

        def submit() -> None:  # on a prepare thread: checking a request is work too (its images)
            request = self._schema.check(obs)
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


def _connected(
    client: asyncio.Task, clients: set[asyncio.Task], depart: Callable[[Hashable], Any]
) -> asyncio.Task:
    """`client` (a connection's task) among `clients`; when it ends it leaves them and `depart(client)`
    lets its robot go."""
    if client not in clients:
        clients.add(client)

        def departed(task: asyncio.Task) -> None:
            clients.discard(task)
            depart(task)

        client.add_done_callback(departed)
    return client


def _settle(future: asyncio.Future, result: dict | Exception) -> None:
    if future.done():  # its client went away meanwhile
        return
    if isinstance(result, Exception):
        future.set_exception(result)
    else:
        future.set_result(result)


def settle_heap() -> None:
    """Takes what a warmed-up server holds for its whole life (params, compiled programs, jax's caches:
    some 600,000 objects on pi05_tiny) out of the garbage collector's full collections: one pass over
    them takes ~0.3 s with the GIL held, a stall every robot's reply would wait out whenever a burst of
    allocations (a flood of frames, a large message) sets one off. Called once, after warm-up, by the
    processes that serve (`oxygen-serve`, each fleet replica)."""
    gc.collect()
    gc.freeze()
