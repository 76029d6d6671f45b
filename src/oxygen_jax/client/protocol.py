"""The wire fields of real-time chunking on openpi's protocol (observation dict in, reply dict out).

An observation may carry `rtc`: {"executed": i, "delay": d, "horizon": s, "chunk_id": c}: the robot has
executed i actions of chunk c (the last one the server sent it) and expects to execute d more before the
new chunk arrives; the new chunk blends into the old one up to index s. A reply carries `chunk_id` (this
chunk's number), `start` (the new chunk's index the robot switches at; 0 without `rtc`) and `stale`
(True when the robot sent a newer request before this one was answered). Clients that send no `rtc`
get openpi's plain reply plus these keys, which they may ignore.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

RTC = "rtc"
CHUNK_ID = "chunk_id"
START = "start"
STALE = "stale"


def continues_chunk(request: Mapping[str, Any]) -> bool:
    """Whether `request` continues the robot's last chunk (it carries `rtc`); one that does not is fresh:
    it draws the config's first-chunk samples and, on a server, takes longer."""
    return RTC in request


def rtc_request(executed: int, delay: int, horizon: int, chunk_id: int) -> dict[str, int]:
    """The `rtc` entry of an observation."""
    return {"executed": executed, "delay": delay, "horizon": horizon, CHUNK_ID: chunk_id}


@dataclasses.dataclass(frozen=True)
class ChunkReply:
    """A reply as the executor uses it: actions [H, A] in the robot's action space."""

    actions: np.ndarray
    chunk_id: int = -1
    start: int = 0
    stale: bool = False

    @classmethod
    def from_reply(cls, reply: Mapping) -> "ChunkReply":
        """Reads a reply dict; a server without real-time chunking (no chunk_id) gives start 0."""
        actions = np.asarray(reply["actions"])
        if actions.ndim != 2 or not len(actions):
            raise ValueError(f"a reply's actions must be [H, A] with H >= 1, got shape {list(actions.shape)}")
        return cls(
            actions=actions,
            chunk_id=int(reply.get(CHUNK_ID, -1)),
            start=int(reply.get(START, 0)),
            stale=bool(reply.get(STALE, False)),
        )
