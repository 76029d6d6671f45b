"""One request on the engine on the caller's thread: the runtime of a caller with no frame clock.

`Policy.infer`, a local robot (`robots/local.py`) and the inline server answer one request at a time: its
one prefill serves the actions and every language request, which decodes to completion within it. The
shared, batched runtime (`runtime.Runtime`) is the other; between them they are the only code that calls
the engine for a request. Several samples denoise together on copies of the one prefix cache, as the
shared runtime's frames draw them.
"""

import dataclasses
import time
from collections.abc import Sequence
from typing import Any, Protocol

import jax
import numpy as np

from oxygen_jax.engine.api import ChunkGuidance, EngineAPI
from oxygen_jax.models import inputs

# A text task's instruction tokens (its suffix on the shared prefix; one compiled shape).
MAX_TASK_TOKENS = 32


@dataclasses.dataclass(frozen=True)
class TextPlan:
    """One language request an observation starts: its task (None: it continues the observation's prompt),
    the task instruction's tokens (the suffix on the shared prefix) and its sampling."""

    task: str | None
    suffix: tuple[int, ...]
    max_new_tokens: int
    temperature: float
    top_p: float
    seed: int


@dataclasses.dataclass(frozen=True)
class Speech:
    """The text of one language request so far: its tokens and, when already detokenized, its text."""

    tokens: np.ndarray
    text: str | None = None


class InlineRequest(Protocol):
    """What the inline runtime reads of a prepared request (`policies.policy.PreparedRequest`): model
    arrays with batch dim 1, its noise [samples, H, A] (None: drawn from `noise_seed`), its guidance and
    the language requests it starts."""

    arrays: dict[str, np.ndarray]
    noise: np.ndarray | None
    noise_seed: int
    texts: tuple[TextPlan, ...]
    guidance: ChunkGuidance | None
    samples: int


class InlineRuntime:
    """The engine's calls for one request at a time; `num_steps` and `max_text_tokens` are the policy's."""

    def __init__(self, engine: EngineAPI, *, num_steps: int, max_text_tokens: int) -> None:
        self.engine = engine
        self.num_steps = num_steps
        self.max_text_tokens = max_text_tokens

    def run(
        self, request: InlineRequest
    ) -> tuple[np.ndarray, dict[str | None, Speech] | None, dict[str, float]]:
        """One request: the chunks it drew [samples, H, A] on the host (`Policy.finish` keeps one), the
        text of each language request by task (None without any) and its timing: `infer_ms` until the
        actions are ready, `text_ms` until the text is."""
        start = time.monotonic()
        noise = request.noise
        if noise is None:
            noise = self.engine.noise(jax.random.key(request.noise_seed), request.samples)
        cache, chunks = self.act(request.arrays, noise, request.guidance)
        timing = {"infer_ms": (time.monotonic() - start) * 1000}
        if not request.texts:
            return chunks, None, timing
        tokens = self.speak(cache, request.texts)
        timing["text_ms"] = (time.monotonic() - start) * 1000
        return chunks, {t.task: Speech(ids) for t, ids in zip(request.texts, tokens, strict=True)}, timing

    def act(
        self, arrays: dict[str, np.ndarray], noise: np.ndarray, guidance: ChunkGuidance | None = None
    ) -> tuple[Any, np.ndarray]:
        """(the observation's prefix cache, its chunks [samples, H, A] on the host) for model arrays with
        batch dim 1 and noise [samples, H, A]: one program for one sample (`Engine.act`), else one prefill
        and the samples denoised together on copies of its cache."""
        observation = inputs.observation_from_arrays(arrays, self.engine.config)
        if len(noise) == 1:
            cache, chunks = self.engine.act(observation, noise, self.num_steps, _guidance(guidance, 1))
            return cache, np.asarray(chunks)
        cache = self.engine.prefill(observation)
        return cache, self.denoise(cache, noise, self.num_steps, guidance)

    def denoise(
        self, cache: Any, noise: np.ndarray, num_steps: int, guidance: ChunkGuidance | None = None
    ) -> np.ndarray:
        """Chunks [samples, H, A] on the host, denoised in `num_steps` on copies of a one-row prefix cache."""
        rows = self.engine.select_rows(cache, np.zeros(len(noise), np.int32))
        return np.asarray(self.engine.denoise(rows, noise, num_steps, _guidance(guidance, len(noise))))

    def speak(self, cache: Any, texts: Sequence[TextPlan]) -> list[np.ndarray]:
        """The tokens of every language request of one observation, decoded to completion on its prefix
        cache: the prompt's continuation on the cache itself, text tasks after one extension call."""
        if texts[0].task is not None:
            cache = self.engine.extend(
                cache, np.zeros(len(texts), np.int32), [list(t.suffix) for t in texts], MAX_TASK_TOKENS
            )
        pad = cache.mask.shape[0] - len(texts)
        out = self.engine.generate(
            cache,
            self.max_text_tokens,
            temperature=np.array([t.temperature for t in texts] + [0.0] * pad, np.float32),
            top_p=texts[0].top_p,
            max_new=np.array([t.max_new_tokens for t in texts] + [1] * pad, np.int32),
            seed=texts[0].seed,
        )
        tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
        return [tokens[i, : lengths[i]].astype(np.int32) for i in range(len(texts))]


def _guidance(guidance: ChunkGuidance | None, samples: int) -> tuple[ChunkGuidance, ...]:
    """The engine's per-row guidance: the request's for every sample, or none."""
    return () if guidance is None else (guidance,) * samples
