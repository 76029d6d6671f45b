"""One `Runtime`, built once from a `RuntimeConfig`: everything between `Policy.prepare` and `Policy.finish`.

It owns the KV cache manager, the frame scheduler, its k policy, the device loop and the output thread;
nothing outside it changes their state. Two ways to drive it:

- served (`loop="async"` or `"frame"`): `start`, then `submit` observations from any thread; the device
  thread runs prefill, denoise and decode chunks and only hands raw results over (action arrays, and
  `TokenEvent`s: a request's new token ids, and its result once done); the output thread detokenizes
  incrementally and runs the replies and the requests' callbacks, in the order the device produced them;
- a frame clock (`loop=None`): the caller calls `step` once per frame; the frame's events go through the
  same output stage on the caller's thread before `step` returns.

`scripts/run.py`, the server's session and every benchmark mode build their runtime here.
"""

import dataclasses
import threading
from collections.abc import Callable, Hashable

import numpy as np

from oxygen_jax.engine.api import RuntimeEngine
from oxygen_jax.runtime.device_loop import MODES, DeviceLoop, DeviceLoopStats, LoopObserver, ObservationWork
from oxygen_jax.runtime.k_policy import DeadlineK, DelayBoundK, FixedK, KPolicy
from oxygen_jax.runtime.manager import KVCacheManager
from oxygen_jax.runtime.output import Detokenize, OutputStage, OutputThread, token_ids_text
from oxygen_jax.runtime.scheduler import FrameInput, FrameResult, FrameScheduler


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """What a runtime is: its batch state, its loop and how many decode steps it takes at once.

    max_slots: language requests decoded together (0: actions only); max_new_tokens: the most tokens a
    request may generate; loop: "async" (language in idle time, chunks bounded by `max_delay_s`, default
    a tenth of the measured action path), "frame" (k tokens per frame before its replies) or None (a
    frame clock calls `step`); k: decode steps per frame, or `target_hz` to fit as many as a frame rate
    leaves time for (frame loop and frame clock); owed_k: the async loop's chunk between two batches;
    num_steps: denoising steps; max_prefill_batch: observations prefilled together; gather_s: how long a
    first waiting observation waits for others; task_suffix_len / max_frame_tasks: room for text tasks'
    instructions (0: none); seed: the noise of observations that bring none; guided: warm-up also
    compiles the guided (real-time chunking) denoiser for every prefill batch, so guided observations
    never compile; max_samples: the most action chunks one observation may draw (`FrameInput.samples`;
    above 1, warm-up compiles their denoising too).
    """

    max_slots: int
    max_new_tokens: int
    loop: str | None = "async"
    k: int = 1
    target_hz: float | None = None
    max_delay_s: float | None = None
    owed_k: int | None = None
    num_steps: int = 10
    max_prefill_batch: int = 4
    gather_s: float = 0.0
    task_suffix_len: int = 0
    max_frame_tasks: int = 0
    seed: int = 0
    guided: bool = False
    max_samples: int = 1

    def __post_init__(self):
        """A one-line ValueError for a value no runtime can take."""
        if self.max_samples < 1:
            raise ValueError(f"max_samples must be >= 1, got {self.max_samples}")
        if self.loop is not None and self.loop not in MODES:
            raise ValueError(f"loop must be one of {MODES} or None, got {self.loop!r}")
        if self.owed_k is not None and self.owed_k < 1:
            raise ValueError(f"owed_k must be >= 1, got {self.owed_k}")
        self.k_policy()  # the k policy checks its own values

    def k_policy(self) -> KPolicy:
        """DelayBoundK for the async loop; DeadlineK with a target rate; else FixedK(k)."""
        max_k = max(self.max_new_tokens, 1)
        if self.loop == "async":
            return DelayBoundK(max_k=max_k, max_delay_s=self.max_delay_s)
        if self.target_hz:
            return DeadlineK(self.target_hz, max_k=max_k)
        return FixedK(self.k)


class Runtime:
    """The manager, scheduler, k policy, device loop and output thread of one engine (see module doc)."""

    def __init__(
        self,
        scheduler: FrameScheduler,
        loop: DeviceLoop | None,
        output: OutputThread,
        *,
        guided: bool = False,
    ):
        """guided: warm-up compiles the guided denoiser too (`RuntimeConfig.guided`)."""
        self._scheduler = scheduler
        self._guided = guided
        self._loop = loop
        self._output = output
        self._started = False
        self._lock = threading.Lock()

    # --- read-only views ---
    @property
    def manager(self) -> KVCacheManager:
        """The KV cache manager, to read (its tables, state size); only the runtime changes it."""
        return self._scheduler.manager

    @property
    def k_policy(self) -> KPolicy:
        return self._scheduler.k_policy

    @property
    def max_batch(self) -> int:
        return self._scheduler.max_prefill_batch

    @property
    def mode(self) -> str | None:
        return None if self._loop is None else self._loop.mode

    @property
    def stats(self) -> DeviceLoopStats:
        return self._served().stats

    @property
    def running(self) -> bool:
        return self._started

    @property
    def waiting(self) -> int:
        """Observations received and not yet prefilled."""
        return self._served().waiting

    @property
    def output_tracked(self) -> int:
        """Requests whose text the output stage is assembling."""
        return self._output.stage.tracked

    # --- lifecycle ---
    def warmup(self, example: dict[str, np.ndarray]) -> None:
        """Compiles every shape steady state can meet, on one observation's model arrays (batch dim 1),
        and leaves the runtime empty. On the device thread once started."""
        self._on_device(lambda: self._warm_up(example))

    def start(self) -> "Runtime":
        """Starts the output thread and the device loop (idempotent)."""
        with self._lock:
            if not self._started:
                self._output.start()
                self._served().start()
                self._started = True
        return self

    def stop(self) -> None:
        """Answers every observation already received, delivers every result, then ends both threads."""
        with self._lock:
            if self._started:
                self._served().stop()
                self._output.stop()
                self._started = False

    # --- served ---
    def observe(self, observer: LoopObserver | None) -> None:
        """Reports every batch of observations and decode chunk to `observer` from now on (None: stop)."""
        self._served().observer = observer

    def submit(self, *works: ObservationWork) -> None:
        """Queues observations (any thread), all at once so they can share a batch; starts the runtime.
        Each `reply` and every callback of their language requests runs on the output thread."""
        self.start()._served().submit(*works)

    def withdraw(self, sender: Hashable) -> int:
        """Drops the waiting observations of `sender`; returns how many."""
        return self._served().withdraw(sender)

    def cancel(self, request_id: int) -> None:
        """Stops a queued or running language request; its `on_done` gets the reason "cancelled"."""

        def cancel() -> None:
            event = self._scheduler.manager.cancel(request_id, self._scheduler.frame)
            if event is not None:
                self._deliver([event])

        if self._started:
            self._served().call(cancel)  # before the device's next piece of work; nobody waits
        else:
            cancel()

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until every result the device handed over so far went through the output stage."""
        return self._output.flush(timeout) if self._started else True

    # --- frame clock ---
    def step(self, frame_inputs: list[FrameInput]) -> FrameResult:
        """One frame on the caller's thread (a runtime built with `loop=None`): actions, decode(k), and the
        frame's events through the output stage; `finished` carries the finished requests' text."""
        if self._loop is not None:
            raise RuntimeError("step drives a frame-clock runtime (loop=None); this one is served: submit")
        result = self._scheduler.step(frame_inputs)
        return dataclasses.replace(result, finished=self._output.stage.dispatch_all(result.events))

    # --- internals ---
    def _served(self) -> DeviceLoop:
        if self._loop is None:
            raise RuntimeError("a frame-clock runtime (loop=None) serves no observations: call step")
        return self._loop

    def _deliver(self, events: list) -> None:
        if self._started:
            self._output.push_events(events)
        else:
            self._output.stage.dispatch_all(events)

    def _on_device(self, fn: Callable[[], None]) -> None:
        """Runs `fn` on the device thread and waits for it (here, while the loop is not running)."""
        if not self._started:
            fn()
            return
        done, failure = threading.Event(), []

        def run() -> None:
            try:
                fn()
            except Exception as error:
                failure.append(error)
            finally:
                done.set()

        self._served().call(run)
        done.wait()
        if failure:
            raise failure[0]

    def _warm_up(self, example: dict[str, np.ndarray]) -> None:
        scheduler = self._scheduler
        if scheduler.manager.max_slots:
            scheduler.warmup(example)
        else:  # actions only
            scheduler.warm_up_actions(example)
        if self._guided:
            scheduler.warm_up_guided(example)
        if scheduler.max_samples > 1:
            scheduler.warm_up_samples(example, self._guided)


def build(
    engine: RuntimeEngine,
    config: RuntimeConfig,
    *,
    detokenize: Detokenize = token_ids_text,
    expected_senders: Callable[[], int] = lambda: 1,
    scheduler_type: type[FrameScheduler] = FrameScheduler,
) -> Runtime:
    """The runtime of `engine` for `config`. detokenize: token ids -> text (the policy's tokenizer);
    expected_senders(): how many robots to expect in a batch (the device loop starts one as soon as that
    many have an observation in); scheduler_type: a FrameScheduler variant (benchmark baselines)."""
    manager = KVCacheManager(engine, config.max_slots, config.max_new_tokens)
    scheduler = scheduler_type(
        engine,
        manager,
        config.k_policy(),
        num_steps=config.num_steps,
        max_prefill_batch=config.max_prefill_batch,
        seed=config.seed,
        task_suffix_len=config.task_suffix_len,
        max_frame_tasks=config.max_frame_tasks,
        max_samples=config.max_samples,
    )
    output = OutputThread(OutputStage(detokenize))
    loop = None
    if config.loop is not None:
        loop = DeviceLoop(
            scheduler,
            output,
            mode=config.loop,
            gather_s=config.gather_s,
            expected_senders=expected_senders,
            owed_k=config.owed_k,
        )
    return Runtime(scheduler, loop, output, guided=config.guided)
