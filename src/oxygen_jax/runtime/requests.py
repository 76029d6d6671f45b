"""Language requests and their results, as the host-side runtime tracks them."""

import dataclasses
import enum
from collections.abc import Callable

import numpy as np

from oxygen_jax.engine.api import SamplingParams


class RequestStatus(enum.Enum):
    QUEUED = "queued"  # waiting for a free slot (its prefix cache row is kept, never re-prefilled)
    RUNNING = "running"  # decoding in a slot of the batch state
    UNKNOWN = "unknown"  # finished (its result went to its callbacks) or never submitted


@dataclasses.dataclass
class TextResult:
    request_id: int
    tokens: np.ndarray  # [n] int32, EOS included when it was emitted
    logprobs: np.ndarray  # [n] float32, temperature-1 log-probabilities of the tokens
    text: str  # filled by the runtime's output stage (the device side leaves it empty)
    finish_reason: str  # "eos", "length" or "cancelled"
    arrival_frame: int
    admitted_frame: int | None
    finished_frame: int

    @property
    def queue_wait_frames(self) -> int:
        return (
            self.admitted_frame if self.admitted_frame is not None else self.finished_frame
        ) - self.arrival_frame


@dataclasses.dataclass
class TextRequest:
    """One language request on one observation. Callbacks run on the runtime's output thread (or, for a
    runtime driven by a frame clock, on the caller's thread after each frame), never on the device's.

    on_tokens(request_id, new_token_ids, text_so_far) streams tokens as frames produce them;
    on_done(result) fires once.
    """

    request_id: int
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    on_tokens: Callable[[int, np.ndarray, str], None] | None = None
    on_done: Callable[[TextResult], None] | None = None
    arrival_frame: int = -1
    admitted_frame: int | None = None

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, seed=self.seed)


@dataclasses.dataclass(frozen=True)
class TokenEvent:
    """What the device produced for one request since its last event: new token ids and, once it
    finished, its result (text not yet detokenized). The device side hands these on and does no more."""

    request: TextRequest
    tokens: np.ndarray
    result: TextResult | None = None
