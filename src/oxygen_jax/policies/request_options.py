"""The one place a request's sampling options are type-checked, wherever they appear.

`max_text_tokens`, `temperature` and `top_p` may sit at the top of a request or inside one of its text
tasks; both go through these functions, so both accept the same types and refuse the rest with the same
one-line `InvalidRequest`. Ranges depend on the policy (its text budget) and are checked by `Policy`.
"""

import math
from typing import Any

import numpy as np

from oxygen_jax.errors import InvalidRequest

_INTEGERS = (int, np.integer)
_NUMBERS = (int, float, np.integer, np.floating)


def integer_option(value: Any, name: str) -> int | None:
    """`value` as an int (None stays None); strings, floats and booleans are refused."""
    if value is None:
        return None
    if isinstance(value, bool | np.bool_) or not isinstance(value, _INTEGERS):
        raise InvalidRequest(f"{name!r}: expected an integer, got {_kind(value)}")
    return int(value)


def number_option(value: Any, name: str) -> float | None:
    """`value` as a finite float (None stays None); strings, booleans, inf and NaN are refused."""
    if value is None:
        return None
    if isinstance(value, bool | np.bool_) or not isinstance(value, _NUMBERS):
        raise InvalidRequest(f"{name!r}: expected a number, got {_kind(value)}")
    number = float(value)
    if not math.isfinite(number):
        raise InvalidRequest(f"{name!r}: expected a finite number, got {number}")
    return number


def _kind(value: Any) -> str:
    """The value's type, and the value itself when short (e.g. `str '5'`, `float 2.7`)."""
    shown = repr(value)
    return f"{type(value).__name__} {shown}" if len(shown) <= 20 else type(value).__name__
