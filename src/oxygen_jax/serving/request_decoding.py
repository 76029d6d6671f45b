"""A client's message to an observation, with the work bounded before anything about it is known.

Observations are small maps of arrays a few levels deep, so a request may hold at most `MAX_CONTAINERS`
maps and lists, `MAX_ITEMS` entries in any one of them and `MAX_NESTING` levels. msgpack checks each
map and list header against `MAX_ITEMS` before reading its items (a list of 15 M ints is refused at its
header, without one int made); strings and binaries are bounded by the message's own length (msgpack's
default, and the server's `max_message_mb` bounds that); every map and list counts as it is built, and
decoding stops at the first past `MAX_CONTAINERS`. The depth check then walks only those containers.

So decoding is cheap, not merely off the event loop: its time is linear in the message's bytes (copies of
strings and binaries, at memory speed) plus at most `MAX_CONTAINERS * MAX_ITEMS` items; the server runs
it on the event loop (a 16 MiB message of one binary decodes in milliseconds).
"""

from typing import Any

from oxygen_jax.serving import msgpack_numpy

MAX_NESTING = 8  # openpi's ALOHA `images/<camera>` arrays are 3 levels deep (an array is a map)
MAX_CONTAINERS = 256
MAX_ITEMS = 256


class BadRequestError(Exception):
    """The client's fault: reported to it, and its connection keeps serving."""


class _TooManyContainersError(Exception):
    pass


def decode_request(message: str | bytes) -> dict:
    """The observation a binary msgpack-numpy message holds, or `BadRequestError` saying what is wrong."""
    if isinstance(message, str):
        raise BadRequestError("expected a binary msgpack frame, got a text frame")
    containers = 0

    def count() -> None:
        nonlocal containers
        containers += 1
        if containers > MAX_CONTAINERS:
            raise _TooManyContainersError

    try:
        obs: Any = msgpack_numpy.unpackb(
            message, on_container=count, max_array_len=MAX_ITEMS, max_map_len=MAX_ITEMS, max_ext_len=0
        )
    except _TooManyContainersError:
        raise BadRequestError(f"observation holds more than {MAX_CONTAINERS} maps and lists") from None
    except Exception as error:
        reason = f"{type(error).__name__}: {error}"
        raise BadRequestError(f"undecodable msgpack-numpy message ({reason})") from error
    if not isinstance(obs, dict):
        raise BadRequestError(f"observation must be a map, got {type(obs).__name__}")
    if _deeper_than(obs, MAX_NESTING):
        raise BadRequestError(f"observation nested deeper than {MAX_NESTING} levels")
    return obs


def _deeper_than(value: dict, limit: int) -> bool:
    """Whether maps and lists nest deeper than `limit`; visits containers only (at most
    `MAX_CONTAINERS`, each of at most `MAX_ITEMS` items), without recursion."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False
