"""A robot's language requests as its replies report them: what each said so far, grouped by the
observation that started them, and the events the `/text` stream sends."""

import dataclasses

import numpy as np

from oxygen_jax.runtime.inline import Speech
from oxygen_jax.runtime.requests import TextResult


@dataclasses.dataclass(frozen=True)
class TextEvent:
    """New tokens of one language request (`tokens`, possibly none in the final event), its text so far
    and, once it finished, `done` with the reason ("eos", "length" or "cancelled"); `task` names its text
    task (None: the request continues the observation's prompt)."""

    robot_id: str
    request_id: int
    task: str | None
    tokens: np.ndarray
    text: str
    done: bool
    finish_reason: str | None = None


@dataclasses.dataclass
class LanguageRequest:
    """One language request of a robot, fed on the runtime's output thread."""

    request_id: int
    robot_id: str
    task: str | None = None
    tokens: list[int] = dataclasses.field(default_factory=list)
    text: str = ""
    result: TextResult | None = None

    def said(self) -> Speech:
        """What a reply says of it: all of its text once done, else its text so far."""
        if self.result is not None:
            return Speech(self.result.tokens, self.result.text)
        return Speech(np.asarray(self.tokens, np.int32), self.text)


@dataclasses.dataclass
class TextGroup:
    """The language requests one observation started (one, or one per text task)."""

    observation_index: int
    requests: list[LanguageRequest]

    @property
    def done(self) -> bool:
        return all(request.result is not None for request in self.requests)
