"""The serving modes as frame runners over one engine. Baselines are settings, not other engines.

`InFrame` decodes language to completion in the frame that asked for it: with the action path's prefix
(shared_kv), with a second prefill as a separate text call would (isolated), or not at all
(action_only). `parallel` runs two InFrame workers in two processes: actions only, and language only
with its own prefill. `Oxygen` is the frame scheduler: shared prefix plus cross-frame batching.
"""

import time

import numpy as np

from oxygen_jax.benchmarks.spec import RunSpec
from oxygen_jax.engine.engine import Engine
from oxygen_jax.models import inputs
from oxygen_jax.runtime import runtime
from oxygen_jax.runtime.manager import KVCacheManager
from oxygen_jax.runtime.requests import TextRequest, TextResult
from oxygen_jax.runtime.runtime import RuntimeConfig
from oxygen_jax.runtime.scheduler import FrameInput, FrameResult

# (act, language source) of each in-frame role; language source None: no language.
_IN_FRAME = {
    "action_only": (True, None),
    "isolated": (True, "own_prefill"),
    "shared_kv": (True, "shared_prefix"),
    "language_only": (False, "own_prefill"),
}


def roles(mode: str) -> tuple[str, ...]:
    """The worker processes of a mode: one each, except parallel's action and language processes."""
    return ("action_only", "language_only") if mode == "parallel" else (mode,)


class InFrame:
    """Prefill + denoise for the action chunk; each request of the frame decoded to completion."""

    def __init__(self, engine: Engine, num_steps: int, act: bool, language: str | None, seed: int = 0):
        self.engine = engine
        self.num_steps = num_steps
        self.act = act
        self.language = language
        self.frame = 0
        self._rng = np.random.default_rng(seed)
        self._next_id = 0

    def warmup(self, example: dict[str, np.ndarray], schedule: list[list[int]]) -> None:
        """Runs one frame per distinct (requests, longest request) shape the schedule will need."""
        shapes = {(len(lengths), max(lengths)) for lengths in schedule if lengths}
        self.step(example, [])
        for rows, longest in sorted(shapes):
            self.step(example, [longest] * rows)
        self.frame = 0

    def step(self, arrays: dict[str, np.ndarray], lengths: list[int]) -> FrameResult:
        engine, config = self.engine, self.engine.config
        start = time.perf_counter()
        obs = inputs.observation_from_arrays(arrays, config)
        actions, cache = [], None
        if self.act:
            noise = self._rng.standard_normal((1, config.action_horizon, config.action_dim), np.float32)
            cache, actions = engine.act(obs, noise, self.num_steps)
            actions = list(np.asarray(actions))
        action_s = time.perf_counter() - start
        finished, steps = [], 0
        if lengths and self.language:
            if cache is None or self.language == "own_prefill":
                cache = engine.prefill(obs)
            steps = max(lengths)
            rows = engine.select_rows(cache, np.zeros(len(lengths), np.int32))
            out = engine.generate(rows, steps, max_new=np.array(lengths))
            finished = self._results(np.asarray(out.tokens), np.asarray(out.lengths))
        total_s = time.perf_counter() - start
        new_tokens = sum(len(r.tokens) for r in finished)
        result = FrameResult(
            frame=self.frame,
            actions=actions,
            finished=finished,
            k=steps,
            decode_batch=len(lengths),
            new_tokens=new_tokens,
            action_s=action_s,
            decode_s=total_s - action_s,
            total_s=total_s,
        )
        self.frame += 1
        return result

    def _results(self, tokens: np.ndarray, lengths: np.ndarray) -> list[TextResult]:
        results = []
        for row, n in enumerate(lengths):
            empty = np.zeros(0, np.float32)
            results.append(
                TextResult(
                    self._next_id, tokens[row, :n], empty, "", "length", self.frame, self.frame, self.frame
                )
            )
            self._next_id += 1
        return results


class Oxygen:
    """The frame scheduler's runtime on a frame clock: one prefill per frame feeds actions and the
    cross-frame language batch."""

    def __init__(self, engine: Engine, spec: RunSpec):
        config = RuntimeConfig(
            max_slots=spec.slots,
            max_new_tokens=spec.longest,
            loop=None,
            k=spec.k,
            target_hz=spec.target_hz,
            num_steps=spec.num_steps,
            max_prefill_batch=1,
            seed=spec.seed,
        )
        self.runtime = runtime.build(engine, config)
        self._next_id = 0

    @property
    def manager(self) -> KVCacheManager:
        return self.runtime.manager

    def warmup(self, example: dict[str, np.ndarray], schedule: list[list[int]]) -> None:
        del schedule  # the runtime's warm-up covers every shape steady state can meet
        self.runtime.warmup(example)

    def step(self, arrays: dict[str, np.ndarray], lengths: list[int]) -> FrameResult:
        requests = [TextRequest(self._next_id + i, n) for i, n in enumerate(lengths)]
        self._next_id += len(lengths)
        return self.runtime.step([FrameInput(arrays, requests=requests)])


def build(role: str, engine: Engine, spec: RunSpec) -> InFrame | Oxygen:
    if role == "oxygen":
        return Oxygen(engine, spec)
    act, language = _IN_FRAME[role]
    return InFrame(engine, spec.num_steps, act, language, spec.seed)
