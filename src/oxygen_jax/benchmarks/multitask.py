"""Several language tasks on one observation: a prefill per task against one prefill plus extension.

Every observation carries three text tasks (subtask N=30, narration N=30, memory N=15), each an
instruction suffix on the observation's prefix. `isolated` pays a prefill per task (the action path's
prefill serves the first task, each other task prefills the observation again, as a separate language
call would); `shared` prefills once and extends the prefix with every task's suffix in one call. Both
run frame-synchronously (each frame decodes its tasks to the end before the next observation) and on
the asynchronous device loop (actions first, decode chunks in idle time; a robot executes each action
chunk for `think_ms` and attaches new tasks to an observation once its previous ones are done).
Measured in process on one engine, as the serving benchmark is.
"""

import dataclasses
import threading
import time

import jax
import numpy as np

from oxygen_jax.engine.batch_state import state_bytes
from oxygen_jax.engine.engine import Engine
from oxygen_jax.models import inputs
from oxygen_jax.policies.policy import MAX_TASK_TOKENS
from oxygen_jax.runtime import runtime
from oxygen_jax.runtime.device_loop import ActionReply, ObservationWork
from oxygen_jax.runtime.requests import TextRequest, TextResult
from oxygen_jax.runtime.runtime import Runtime, RuntimeConfig
from oxygen_jax.runtime.scheduler import FrameInput, FrameScheduler, PendingActions

SHARING = ("isolated", "shared")
DECODING = ("frame", "async")
# (name, max new tokens, instruction length in tokens): the workload every mode serves.
TASKS = (("subtask", 30, 10), ("narration", 30, 12), ("memory", 15, 14))
# Extra prefills isolated pays per observation: one per task beyond the one the actions' prefill serves.
PREFILLS_SAVED = len(TASKS) - 1


@dataclasses.dataclass(frozen=True)
class Setting:
    frames: int = 8  # measured frames of the frame-synchronous modes
    seconds: float = 10.0  # measured time of each asynchronous mode
    think_ms: float = (
        100.0  # asynchronous modes: the robot executes its actions this long before sending again
    )
    seed: int = 0


class CountingEngine:
    """The engine with its prefill and extend calls counted (what sharing saves, independent of time)."""

    def __init__(self, engine: Engine):
        self._engine = engine
        self.calls = {"prefill": 0, "extend": 0}

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def prefill(self, *args, **kwargs):
        self.calls["prefill"] += 1
        return self._engine.prefill(*args, **kwargs)

    def act(self, *args, **kwargs):
        self.calls["prefill"] += 1  # prefill and denoise in one program
        return self._engine.act(*args, **kwargs)

    def extend(self, *args, **kwargs):
        self.calls["extend"] += 1
        return self._engine.extend(*args, **kwargs)

    def reset(self) -> None:
        self.calls = dict.fromkeys(self.calls, 0)


class IsolatedTasks(FrameScheduler):
    """The baseline: the first task of an observation continues the action path's prefix; every other
    task pays its own prefill of the observation before its suffix is appended."""

    def start_act(self, frame_inputs: list[FrameInput]) -> PendingActions:
        firsts = [dataclasses.replace(item, tasks=item.tasks[:1]) for item in frame_inputs]
        actions = super().start_act(firsts)
        for item in frame_inputs:
            obs = inputs.observation_from_arrays(item.arrays, self.engine.config)
            for request, suffix in item.tasks[1:]:
                cache = self.engine.prefill(obs)
                extended = self.engine.extend(cache, np.zeros(1, np.int32), [suffix], self.task_suffix_len)
                self.manager.check(request, extended)
                self.manager.submit(request, extended, 0, self.frame)
        return actions


def instructions(vocab_size: int, seed: int) -> list[list[int]]:
    """Each task's instruction tokens (synthetic ids; only their count matters for the cost)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab_size, size=length).tolist() for _, _, length in TASKS]


class _Workload:
    """Issues the three tasks of an observation and tallies their finished tokens."""

    def __init__(self, suffixes: list[list[int]]):
        self.suffixes = suffixes
        self.tokens = 0
        self.texts = 0
        self.outstanding = 0
        self._next_id = 0
        self._lock = threading.Lock()

    def tasks(self) -> list[tuple[TextRequest, list[int]]]:
        out = []
        for (_, max_new, _), suffix in zip(TASKS, self.suffixes, strict=True):
            out.append((TextRequest(self._next_id, max_new, on_done=self._done), suffix))
            self._next_id += 1
        with self._lock:
            self.outstanding += len(out)
        return out

    def _done(self, result: TextResult) -> None:
        with self._lock:
            self.tokens += len(result.tokens)
            self.texts += 1
            self.outstanding -= 1


def build_runtime(engine: CountingEngine, sharing: str, decoding: str, example: dict, seed: int) -> Runtime:
    """A runtime with room for one observation's tasks, every shape compiled, counters at zero: a frame
    clock decoding the longest task inside each frame, or the async device loop."""
    longest = max(n for _, n, _ in TASKS)
    config = RuntimeConfig(
        max_slots=len(TASKS),
        max_new_tokens=longest,
        loop=None if decoding == "frame" else "async",
        k=longest,
        max_prefill_batch=1,
        seed=seed,
        task_suffix_len=MAX_TASK_TOKENS,
        max_frame_tasks=len(TASKS),
    )
    scheduler_type = IsolatedTasks if sharing == "isolated" else FrameScheduler
    built = runtime.build(engine, config, scheduler_type=scheduler_type)
    built.warmup(example)
    engine.reset()
    return built


def _frame_mode(frames: Runtime, observations: list, suffixes, setting: Setting) -> dict:
    """One observation per frame; decode(longest task) inside the frame, so its tasks all finish in it."""
    workload = _Workload(suffixes)
    frame_s = []
    start = time.perf_counter()
    for frame in range(setting.frames):
        arrays = observations[frame % len(observations)]
        frame_s.append(frames.step([FrameInput(arrays, tasks=workload.tasks())]).total_s)
    wall = time.perf_counter() - start
    return {
        "observations": setting.frames,
        "frame_ms_mean": float(np.mean(frame_s)) * 1e3,
        "wall_s": wall,
        "tokens": workload.tokens,
        "texts": workload.texts,
    }


def _async_mode(loop: Runtime, observations: list, suffixes, setting: Setting) -> dict:
    """One robot: observation, actions, `think_ms` executing them, next observation; an observation
    carries tasks once the previous ones finished. frame_ms_mean is the observation-to-actions latency."""
    workload = _Workload(suffixes)
    replied = threading.Event()
    errors: list[Exception] = []

    def on_reply(reply: ActionReply) -> None:
        if reply.error is not None:
            errors.append(reply.error)
        replied.set()

    latencies, sent = [], 0
    start = time.perf_counter()
    try:
        while time.perf_counter() - start < setting.seconds and not errors:
            tasks = workload.tasks() if workload.outstanding == 0 else []
            replied.clear()
            sent_at = time.perf_counter()
            loop.submit(
                ObservationWork(FrameInput(observations[sent % len(observations)], tasks=tasks), on_reply)
            )
            replied.wait()
            latencies.append(time.perf_counter() - sent_at)
            sent += 1
            time.sleep(setting.think_ms / 1e3)
        wall = time.perf_counter() - start
    finally:
        loop.stop()
    if errors:
        raise errors[0]
    return {
        "observations": sent,
        "frame_ms_mean": float(np.mean(latencies)) * 1e3,
        "wall_s": wall,
        "tokens": workload.tokens,
        "texts": workload.texts,
    }


def prefill_ms(engine: Engine, example: dict, reps: int = 7) -> float:
    """Best-of-`reps` time of one observation's prefill (compiled by warm-up)."""
    obs = inputs.observation_from_arrays(example, engine.config)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(engine.prefill(obs))
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def run(engine: Engine, observations: list, setting: Setting) -> dict:
    """Every (sharing, decoding) mode; the speedup of sharing and how much of the cost model's bound
    (PREFILLS_SAVED prefills per observation off the isolated frame) it reaches."""
    counted = CountingEngine(engine)
    suffixes = instructions(engine.config.vocab_size, setting.seed)
    modes, bytes_per_task, prefill = {}, None, None
    for sharing in SHARING:
        for decoding in DECODING:
            built = build_runtime(counted, sharing, decoding, observations[0], setting.seed)
            prefill = prefill or prefill_ms(engine, observations[0])
            bytes_per_task = state_bytes(built.manager.state) / built.manager.max_slots
            counted.reset()
            measure = _frame_mode if decoding == "frame" else _async_mode
            result = measure(built, observations, suffixes, setting)
            wall = result.pop("wall_s")
            modes[f"{sharing}_{decoding}"] = {
                "sharing": sharing,
                "decoding": decoding,
                "action_hz": result["observations"] / wall,
                "tokens_per_s": result["tokens"] / wall,
                **result,
                "wall_s": wall,
                "engine_calls": dict(counted.calls),
            }
    isolated_ms = modes["isolated_frame"]["frame_ms_mean"]
    bound = isolated_ms / max(isolated_ms - PREFILLS_SAVED * prefill, 1e-9)
    speedup = modes["shared_frame"]["action_hz"] / modes["isolated_frame"]["action_hz"]
    return {
        "tasks": [{"name": n, "max_new_tokens": m, "instruction_tokens": t} for n, m, t in TASKS],
        "setting": dataclasses.asdict(setting),
        "modes": modes,
        "speedup_vs_isolated": speedup,
        "speedup_vs_isolated_async": modes["shared_async"]["action_hz"]
        / modes["isolated_async"]["action_hz"],
        "prefill_ms": prefill,
        "cost_model": {"prefills_saved_per_observation": PREFILLS_SAVED, "speedup_bound": bound},
        "fraction_of_bound": speedup / bound,
        # A slot of the batch state: the extended row's K/V (prefix + suffix columns), its decode buffers.
        "memory_per_extra_task_bytes": bytes_per_task,
    }
