"""Batches made on a background thread while the device trains on the previous ones.

Decoding images and running the robot transforms is numpy and PIL work that releases the GIL for most of
its time, so a thread overlaps it with the jitted train step.
"""

import dataclasses
import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class _Failure:
    error: BaseException


def prefetch(items: Iterator[T], size: int = 2) -> Iterator[T]:
    """`items`, made up to `size` ahead on a daemon thread; an error there is raised here, in order."""
    ready: queue.Queue = queue.Queue(maxsize=size)

    def fill() -> None:
        try:
            for item in items:
                ready.put(item)
        except BaseException as error:  # handed to the consumer, which raises it
            ready.put(_Failure(error))
            return
        ready.put(_Failure(StopIteration()))

    threading.Thread(target=fill, daemon=True, name="prefetch").start()
    while True:
        item = ready.get()
        if isinstance(item, _Failure):
            if isinstance(item.error, StopIteration):
                return
            raise item.error
        yield item
