"""One thread owns the device: waiting observations first, language decode chunks whenever none waits.

Robots send an observation, execute the returned actions for a while, then send the next, so the device
is idle between their requests. `DeviceLoop` takes two classes of work from other threads:

- observations (`submit`): it gathers what is waiting (up to the scheduler's prefill batch, until every
  expected sender has one in or `gather_s` after the first), runs prefill + denoise
  (`FrameScheduler.act_only`) and hands each its actions the moment they are on the host, before any
  language work; the batch's language requests then join the batch state;
- language (`mode="async"`): whenever no observation is ready, one decode chunk of k steps over every
  running request (`FrameScheduler.decode_chunk`), its tokens streamed by the output thread; and at
  least one chunk between two batches of observations, so robots that call back to back cannot starve
  language. That owed chunk is dispatched before the batch's actions are pulled to the host, so the
  device decodes while the host copies the actions and hands out the replies.
  k comes from the scheduler's k policy (`DelayBoundK` keeps a chunk within the action delay
  it allows), so an observation that arrives during a chunk waits at most that chunk; the chunk owed
  between two batches takes `owed_k` steps when set (the frame loop's k: with no idle time, the loop
  then spends what the frame loop spends on language, and no more).

`mode="frame"` is the paper's frame loop driven by arrivals: each gathered batch runs one whole
`FrameScheduler.step` (actions, then decode(k)) before its replies leave, and language advances only in
frames. With nothing to do the thread blocks on a condition variable (no spinning). The scheduler and its
manager belong to this thread once it started; other threads reach them through `call`. The thread does
no host work on results: replies and token events go to the runtime's output thread, in device order.
A batch whose model call fails is retried one observation at a time, so only an observation that fails
again hears the error. `stop` answers every observation already received before the thread ends.
"""

import dataclasses
import enum
import functools
import logging
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Protocol

import numpy as np

from oxygen_jax.runtime.output import OutputThread
from oxygen_jax.runtime.scheduler import FrameInput, FrameScheduler

logger = logging.getLogger(__name__)

MODES = ("async", "frame")


@dataclasses.dataclass
class ActionReply:
    """What one observation gets: its actions ([H, action_dim]; [samples, H, action_dim] for one drawing
    several chunks) or the error that stopped its batch."""

    actions: np.ndarray | None
    error: Exception | None
    wait_s: float  # receipt until the device started on its batch
    action_s: float  # its batch's prefill + denoise (frame mode: the whole frame)
    batch: int  # observations prefilled together with it


@dataclasses.dataclass
class ObservationWork:
    """One observation for the device; `reply` runs on the output thread once its actions are ready."""

    frame_input: FrameInput
    reply: Callable[[ActionReply], None]
    sender: Hashable = None
    received: float = dataclasses.field(default_factory=time.perf_counter)


@dataclasses.dataclass
class DeviceLoopStats:
    """Where the device thread's time went since `start`."""

    action_s: float = 0.0  # prefill + denoise (frame mode: whole frames)
    decode_s: float = 0.0  # decode chunks with their harvest
    idle_s: float = 0.0  # blocked with nothing to do
    batches: int = 0
    observations: int = 0
    chunks: int = 0
    chunk_steps: int = 0
    chunk_rows: int = 0  # sum over chunks of active slots x steps: tokens the chunks could produce
    wakeups: int = 0  # times the thread woke from waiting
    started: float = 0.0

    def busy_fraction(self, now: float | None = None) -> float:
        wall = (now or time.perf_counter()) - self.started
        return (self.action_s + self.decode_s) / max(wall, 1e-9)


class LoopObserver(Protocol):
    """Told what the device thread did (e.g. to export metrics); called on that thread, so it must return at
    once."""

    def batch_done(self, waits_s: Sequence[float], action_s: float) -> None:
        """A batch of observations got its actions: each one's wait (receipt to batch start) and the batch's
        prefill + denoise seconds (frame mode: the whole frame)."""

    def chunk_done(self, steps: int, rows: int, seconds: float) -> None:
        """A decode chunk of `steps` over `rows` active slots took `seconds` (with its harvest)."""


class _Step(enum.Enum):
    CALLS = "calls"
    OBSERVE = "observe"
    DECODE = "decode"
    EXIT = "exit"


class DeviceLoop:
    def __init__(
        self,
        scheduler: FrameScheduler,
        output: OutputThread,
        *,
        mode: str = "async",
        gather_s: float = 0.0,
        expected_senders: Callable[[], int] = lambda: 1,
        owed_k: int | None = None,
    ):
        """gather_s: how long the first waiting observation may wait for others to be prefilled with it;
        expected_senders(): how many distinct senders to expect (a batch starts as soon as that many have
        an observation in); owed_k: decode steps of the chunk owed between two batches (None: the k
        policy's choice)."""
        if mode not in MODES:
            raise ValueError(f"loop must be one of {MODES}, got {mode!r}")
        self.scheduler = scheduler
        self.output = output
        self.mode = mode
        self.gather_s = gather_s
        self.expected_senders = expected_senders
        self.owed_k = owed_k
        self.stats = DeviceLoopStats()
        self.observer: LoopObserver | None = None
        self._cond = threading.Condition()
        self._waiting: list[ObservationWork] = []
        self._calls: list[Callable[[], None]] = []
        self._closed = False
        self._chunk_owed = False  # async: a batch of observations ran since the last decode chunk
        self._thread: threading.Thread | None = None

    @property
    def max_batch(self) -> int:
        return self.scheduler.max_prefill_batch

    def start(self) -> "DeviceLoop":
        if self._thread is not None:
            raise RuntimeError("device loop already started")
        self.stats = DeviceLoopStats(started=time.perf_counter())
        self._thread = threading.Thread(target=self._run, name="device-loop", daemon=True)
        self._thread.start()
        return self

    def submit(self, *works: ObservationWork) -> None:
        """Queues observations (any thread), all at once (so they can share a batch); RuntimeError once the
        loop is stopping."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the device loop is shutting down")
            self._waiting.extend(works)
            self._cond.notify()

    def withdraw(self, sender: Hashable) -> int:
        """Drops the waiting observations of `sender` (a robot that left; nobody is there to reply to);
        returns how many."""
        with self._cond:
            kept = [work for work in self._waiting if work.sender != sender]
            dropped = len(self._waiting) - len(kept)
            self._waiting = kept
            return dropped

    @property
    def running(self) -> bool:
        return self._thread is not None

    @property
    def waiting(self) -> int:
        """Observations received and not yet in a batch."""
        return len(self._waiting)

    def call(self, fn: Callable[[], None]) -> None:
        """Runs `fn` on the device thread before its next piece of work (e.g. to cancel a request)."""
        with self._cond:
            self._calls.append(fn)
            self._cond.notify()

    def stop(self, timeout: float | None = None) -> None:
        """Refuses new observations, answers every waiting one, then ends the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError("the device loop did not stop in time")
            self._thread = None

    # --- the device thread ---
    def _run(self) -> None:
        while True:
            step, payload = self._next()
            if step is _Step.EXIT:
                return
            if step is _Step.CALLS:
                for fn in payload:
                    try:
                        fn()
                    except Exception:
                        logger.exception("device loop call failed")
            elif step is _Step.OBSERVE:
                self._observe(payload)
                self._chunk_owed = True
            else:
                self._decode_chunk(*payload)

    def _next(self) -> tuple[_Step, list]:
        """The next piece of work by priority: calls, the decode chunk owed since the last batch, a
        gathered batch of observations, a decode chunk; blocks (no spinning) while there is none."""
        manager = self.scheduler.manager
        with self._cond:
            while True:
                if self._calls:
                    calls, self._calls = self._calls, []
                    return _Step.CALLS, calls
                now = time.perf_counter()
                language = self.mode == "async" and bool(manager.active or manager.queued)
                if language and self._chunk_owed and not self._closed:
                    self._chunk_owed = False  # back-to-back observations never starve language
                    return _Step.DECODE, [self.owed_k]
                if self._waiting and (self._closed or self._gathered(now)):
                    batch = self._waiting[: self.max_batch]
                    del self._waiting[: len(batch)]
                    return _Step.OBSERVE, batch
                if language and not self._closed:
                    self._chunk_owed = False
                    return _Step.DECODE, [None]
                if self._closed and not self._waiting:
                    return _Step.EXIT, []
                timeout = self._waiting[0].received + self.gather_s - now if self._waiting else None
                self._cond.wait(timeout)
                self.stats.idle_s += time.perf_counter() - now
                self.stats.wakeups += 1

    def _gathered(self, now: float) -> bool:
        senders = {work.sender for work in self._waiting}
        return (
            len(self._waiting) >= self.max_batch
            or len(senders) >= self.expected_senders()
            or now - self._waiting[0].received >= self.gather_s
        )

    def _observe(self, batch: list[ObservationWork]) -> None:
        start = time.perf_counter()
        try:
            outcomes = [(actions, None) for actions in self._run_batch([work.frame_input for work in batch])]
        except Exception as error:
            logger.exception("a batch of %d observation(s) failed", len(batch))
            if len(batch) == 1:
                outcomes = [(None, error)]
            else:  # retried one at a time: only an observation that fails again hears an error
                outcomes = [self._run_alone(work.frame_input) for work in batch]
        action_s = time.perf_counter() - start
        if self.mode == "async":
            self.scheduler.k_policy.observe_action(action_s)
        self.stats.action_s += action_s
        self.stats.batches += 1
        self.stats.observations += len(batch)
        if self.observer is not None:
            self.observer.batch_done([start - work.received for work in batch], action_s)
        for work, (actions, error) in zip(batch, outcomes, strict=True):
            reply = ActionReply(actions, error, start - work.received, action_s, len(batch))
            self.output.push(functools.partial(work.reply, reply))

    def _run_batch(self, inputs: list[FrameInput]) -> list[np.ndarray]:
        """Frame mode: one whole frame (actions, then decode(k)); async: the actions only."""
        if self.mode == "frame":
            result = self.scheduler.step(inputs)
            self.output.push_events(result.events)  # before the replies, as the frame produced them
            return result.actions
        return self.scheduler.act_only(inputs, then_chunk=True, k=self.owed_k)

    def _run_alone(self, frame_input: FrameInput) -> tuple[np.ndarray | None, Exception | None]:
        try:
            return self._run_batch([frame_input])[0], None
        except Exception as error:
            logger.exception("an observation failed on its own")
            return None, error

    def _decode_chunk(self, k: int | None) -> None:
        """One chunk of `k` steps (None: the k policy's choice)."""
        chunk, chunk_s = self.scheduler.decode_chunk(k)
        self.output.push_events(chunk.events)
        self.stats.decode_s += chunk_s
        self.stats.chunks += 1
        self.stats.chunk_steps += chunk.k
        self.stats.chunk_rows += chunk.k * chunk.decode_batch
        if self.observer is not None:
            self.observer.chunk_done(chunk.k, chunk.decode_batch, chunk_s)
