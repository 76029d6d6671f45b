"""Prometheus metrics of one server, in its own registry (several servers may share a process).

`GET /metrics` on the server's port answers `ServerMetrics.exposition()` in the Prometheus text format.
What is measured where:

- the websocket server: every request (`oxygen_requests_total`), the action latency from receipt of the
  message to the reply sent (`oxygen_action_latency_seconds`, by robot kind) and errors by kind
  (`oxygen_errors_total{kind="bad_request"|"internal"}`), and what it refused before any work
  (`oxygen_refusals_total{reason}`: rate limit, drain, API keys, connections, slow `/text` readers);
- the device loop (`runtime.device_loop.LoopObserver`): each observation's queue wait, each prefill batch's
  size and prefill + denoise seconds, each decode chunk's seconds and steps;
- the session's text events: tokens produced and language requests finished (by reason);
- read when scraped: slots in use and their number, observations waiting, the device's busy fraction,
  compilations after warm-up (in this process), connected robots and readiness; and the process's own
  (`process_resident_memory_bytes`, CPU seconds, open files: prometheus_client's process collector).

The streaming backend reports all of them; the inline one (`--language=inline`, no device loop) the
server's and readiness only.
"""

import dataclasses
import http
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    Info,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from websockets.asyncio.server import ServerConnection
from websockets.http11 import Response

from oxygen_jax.engine import compile_counter

# Seconds: a tiny model on a CPU answers in milliseconds, a full one on a CPU in tens of seconds.
SECONDS_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)

# What `ServerMetrics.watch` readers may report when scraped: name -> (help, is a counter).
LIVE = {
    "oxygen_slots_in_use": ("Language slots holding a request.", False),
    "oxygen_slots_max": ("Language slots of the batch state.", False),
    "oxygen_observations_waiting": ("Observations received and not yet prefilled.", False),
    "oxygen_device_busy_fraction": ("Share of the device thread's time computing since it started.", False),
    "oxygen_connected_robots": ("Robots connected that sent an observation.", False),
    "oxygen_ready": ("1 once warm-up compiled every program.", False),
    "oxygen_compilations_after_warmup": ("XLA compilations in this process after warm-up.", True),
    "oxygen_pending_request_bytes": ("Bytes of requests received and not yet answered.", False),
}


@dataclasses.dataclass(eq=False)  # the registry keys its collectors by identity
class _Live:
    """A scrape-time collector over the readers `ServerMetrics.watch` was given."""

    readers: list[Callable[[], Mapping[str, float]]] = dataclasses.field(default_factory=list)

    def collect(self) -> Iterator[Metric]:
        values: dict[str, float] = {}
        for read in self.readers:
            values.update(read())
        for name, value in values.items():
            help_text, counter = LIVE[name]
            family = CounterMetricFamily if counter else GaugeMetricFamily
            yield family(name, help_text, value=value)


class ServerMetrics:
    """The metrics of one server; every method may be called from any thread."""

    def __init__(self, metadata: Mapping[str, Any]) -> None:
        """metadata: the backend's (its `robot` labels the latency; `config` and `replica_id` go into
        `oxygen_server_info`)."""
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, cpu seconds, ...
        self.robot = str(metadata.get("robot", "unknown"))
        info = Info("oxygen_server", "What this server serves.", registry=self.registry)
        info.info({key: str(metadata.get(key, "")) for key in ("robot", "config", "replica_id")})
        kw = {"registry": self.registry}
        self.requests = Counter("oxygen_requests", "Requests received, answered or not.", ["robot"], **kw)
        self.latency = Histogram(
            "oxygen_action_latency_seconds",
            "Receipt of a request until its reply with actions was sent.",
            ["robot"],
            buckets=SECONDS_BUCKETS,
            **kw,
        )
        self.errors = Counter("oxygen_errors", "Requests answered with an error, by kind.", ["kind"], **kw)
        self.refusals = Counter(
            "oxygen_refusals",
            "Requests and connections refused before any work, by reason (rate_limit, flood, "
            "flood_throttled, draining, api_key, api_key_throttled, connection, slow_reader).",
            ["reason"],
            **kw,
        )
        self.queue_wait = Histogram(
            "oxygen_queue_wait_seconds",
            "An observation's wait from receipt until the device started on its batch.",
            buckets=SECONDS_BUCKETS,
            **kw,
        )
        self.batch_size = Histogram(
            "oxygen_prefill_batch_size", "Observations prefilled together.", buckets=BATCH_BUCKETS, **kw
        )
        self.action_compute = Histogram(
            "oxygen_prefill_denoise_seconds",
            "One batch's prefill and denoise until its actions were on the host (frame loop: the frame).",
            buckets=SECONDS_BUCKETS,
            **kw,
        )
        self.decode = Histogram(
            "oxygen_decode_chunk_seconds", "One decode chunk with its harvest.", buckets=SECONDS_BUCKETS, **kw
        )
        self.decode_steps = Counter("oxygen_decode_steps", "Decode steps run (each over every slot).", **kw)
        self.text_tokens = Counter("oxygen_text_tokens", "Language tokens produced.", **kw)
        self.text_finished = Counter(
            "oxygen_text_requests_finished", "Language requests finished, by reason.", ["reason"], **kw
        )
        self._live = _Live()
        self.registry.register(self._live)
        self._lock = threading.Lock()
        self._warm_compilations: int | None = None

    # --- the websocket server ---
    def request_answered(self, seconds: float, error_kind: str | None) -> None:
        """One request answered after `seconds`: with actions (error_kind None) or with an error."""
        self.requests.labels(self.robot).inc()
        if error_kind is None:
            self.latency.labels(self.robot).observe(seconds)
        else:
            self.errors.labels(error_kind).inc()

    # --- the device loop (runtime.device_loop.LoopObserver) ---
    def batch_done(self, waits_s: Sequence[float], action_s: float) -> None:
        for wait in waits_s:
            self.queue_wait.observe(wait)
        self.batch_size.observe(len(waits_s))
        self.action_compute.observe(action_s)

    def chunk_done(self, steps: int, rows: int, seconds: float) -> None:
        if steps and rows:
            self.decode.observe(seconds)
            self.decode_steps.inc(steps)

    # --- the session's text events ---
    def text_event(self, tokens: int, finish_reason: str | None) -> None:
        self.text_tokens.inc(tokens)
        if finish_reason is not None:
            self.text_finished.labels(finish_reason).inc()

    # --- read when scraped ---
    def watch(self, read: Callable[[], Mapping[str, float]]) -> None:
        """Adds a reader of `LIVE` values, called at every scrape."""
        self._live.readers.append(read)

    def warmed_up(self) -> None:
        """Compilations from now on count as compilations after warm-up (the first call sets the mark)."""
        with self._lock:
            if self._warm_compilations is None:
                self._warm_compilations = compile_counter.compilations()

    def readiness(self, ready: bool) -> dict[str, float]:
        """The `LIVE` values of readiness (marking warm-up done the first time it is seen)."""
        if ready:
            self.warmed_up()
        mark = self._warm_compilations
        after = 0 if mark is None else compile_counter.compilations() - mark
        return {"oxygen_ready": float(ready), "oxygen_compilations_after_warmup": after}

    def exposition(self) -> bytes:
        """Every metric in the Prometheus text format."""
        return generate_latest(self.registry)


def of(backend: Any) -> ServerMetrics | None:
    """The metrics a server backend keeps (None: off, or a backend without any)."""
    return getattr(backend, "metrics", None)


def respond(connection: ServerConnection, backend: Any) -> Response:
    """`GET /metrics`: the backend's metrics, or 404 when it keeps none."""
    metrics = of(backend)
    if metrics is None:
        return connection.respond(http.HTTPStatus.NOT_FOUND, "Metrics are off on this server\n")
    response = connection.respond(http.HTTPStatus.OK, metrics.exposition().decode())
    del response.headers["Content-Type"]
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


def refused(backend: Any, reason: str) -> None:
    """One request or connection refused before any work (see `ServerMetrics.refusals`)."""
    metrics = of(backend)
    if metrics is not None:
        metrics.refusals.labels(reason).inc()


def record(backend: Any, seconds: float, error_kind: str | None) -> None:
    """One answered request, for a backend that keeps metrics."""
    metrics = of(backend)
    if metrics is not None:
        metrics.request_answered(seconds, error_kind)
