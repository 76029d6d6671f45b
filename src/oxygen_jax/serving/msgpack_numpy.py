"""msgpack with numpy arrays, in the wire format that openpi clients speak.

An array travels as a map ``{b"__ndarray__": True, b"data": raw bytes, b"dtype": dtype.str,
b"shape": shape}`` and a numpy scalar as ``{b"__npgeneric__": True, b"data": item, b"dtype": dtype.str}``.
The keys are binary strings and their order is fixed, so our bytes equal an openpi client's for the same
object and either side decodes the other's. Object, void and complex dtypes are refused in both directions:
they cannot travel as plain bytes, and decoding them from a buffer would be unsafe.
"""

from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np

_ARRAY_TAG = b"__ndarray__"
_SCALAR_TAG = b"__npgeneric__"
_REFUSED_KINDS = frozenset("VOc")


def packb(obj: Any) -> bytes:
    """Serialize ``obj``; numpy arrays and scalars may appear anywhere inside it."""
    return msgpack.packb(obj, default=_encode)


def unpackb(data: bytes, *, on_container: Callable[[], None] | None = None, **limits: int) -> Any:
    """Deserialize :func:`packb` or openpi client bytes; arrays are read-only views, not copies.

    limits: msgpack's own (`max_array_len`, `max_map_len`, ...), checked on each header before its items
    are read; `on_container()` runs once per map and list as it is built and may raise to stop decoding.
    """
    if on_container is None:
        return msgpack.unpackb(data, object_hook=_decode, **limits)

    def object_hook(obj: dict) -> Any:
        on_container()
        return _decode(obj)

    def list_hook(items: list) -> list:
        on_container()
        return items

    return msgpack.unpackb(data, object_hook=object_hook, list_hook=list_hook, **limits)


def _checked_dtype(dtype: Any) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype.kind in _REFUSED_KINDS:
        raise ValueError(f"unsupported dtype: {dtype}")
    return dtype


def _encode(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        dtype = _checked_dtype(obj.dtype)
        return {_ARRAY_TAG: True, b"data": obj.tobytes(), b"dtype": dtype.str, b"shape": obj.shape}
    if isinstance(obj, np.generic):
        dtype = _checked_dtype(obj.dtype)
        return {_SCALAR_TAG: True, b"data": obj.item(), b"dtype": dtype.str}
    raise TypeError(f"cannot serialize {type(obj).__name__!r} object")


def _decode(obj: dict) -> Any:
    if _ARRAY_TAG in obj:
        dtype = _checked_dtype(obj[b"dtype"])
        return np.frombuffer(obj[b"data"], dtype=dtype).reshape(obj[b"shape"])
    if _SCALAR_TAG in obj:
        return _checked_dtype(obj[b"dtype"]).type(obj[b"data"])
    return obj
