"""A request's options (`RequestOptions`, as `Policy.infer` takes them), and the one place its sampling
options are type-checked, wherever they appear.

`max_text_tokens`, `temperature` and `top_p` may sit at the top of a request or inside one of its text
tasks; both go through these functions, so both accept the same types and refuse the rest with the same
one-line `InvalidRequest`. Ranges depend on the policy (its text budget) and are checked by `Policy`.
"""

import dataclasses
import math
from typing import Any

import numpy as np

from oxygen_jax.engine.api import ChunkGuidance
from oxygen_jax.errors import InvalidRequest
from oxygen_jax.policies.executed_chunk import ExecutedChunkGuidance

_INTEGERS = (int, np.integer)
_NUMBERS = (int, float, np.integer, np.floating)
# Instances of the types above that are no number: a numpy timedelta64 is an np.integer.
_NOT_NUMBERS = (bool, np.bool_, np.timedelta64, np.datetime64)


@dataclasses.dataclass(frozen=True)
class RequestOptions:
    """One request's options, as `Policy.infer` takes them (None: the policy's own).

    noise: [H, action_dim] (or [samples, H, action_dim]) makes the action sample deterministic;
    samples: how many action chunks to draw from the observation's one prefill, keeping the one inside the
    motion most of them took (`policies.chunk_choice`);
    prompt_for_text: ask for text (None: iff the policy speaks; False: actions only); max_text_tokens,
    temperature, top_p: the text budget (at most the policy's) and sampling; text_tasks: several named
    language tasks (see `policies.text_tasks`), each decoding after its instruction appended to the prefix;
    guidance: real-time chunking towards the robot's previous chunk: in model space as given, or as the
    robot executes it (`ExecutedChunkGuidance`, expressed in this request's model space; `robots.chunks`).
    """

    noise: np.ndarray | None = None
    samples: int = 1
    prompt_for_text: bool | None = None
    max_text_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    text_tasks: Any = None
    guidance: ChunkGuidance | ExecutedChunkGuidance | None = None


def integer_option(value: Any, name: str) -> int | None:
    """`value` as an int (None stays None); strings, floats, booleans and numpy times are refused."""
    if value is None:
        return None
    if isinstance(value, _NOT_NUMBERS) or not isinstance(value, _INTEGERS):
        raise InvalidRequest(f"{name!r}: expected an integer, got {value_kind(value)}")
    return int(value)


def number_option(value: Any, name: str) -> float | None:
    """`value` as a finite float (None stays None); strings, booleans, numpy times, inf, NaN: refused."""
    if value is None:
        return None
    if isinstance(value, _NOT_NUMBERS) or not isinstance(value, _NUMBERS):
        raise InvalidRequest(f"{name!r}: expected a number, got {value_kind(value)}")
    number = float(value)
    if not math.isfinite(number):
        raise InvalidRequest(f"{name!r}: expected a finite number, got {number}")
    return number


def value_kind(value: Any) -> str:
    """The value's type, and the value itself when short and on one line (e.g. `str '5'`, `float 2.7`),
    for a refusal to name what it got."""
    shown = repr(value)
    return (
        f"{type(value).__name__} {shown}" if len(shown) <= 20 and "\n" not in shown else type(value).__name__
    )
