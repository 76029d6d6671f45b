"""Robot-side execution of action chunks: `Executor` runs the control loop against any policy with
openpi's `infer(obs) -> dict` (openpi-client's websocket policy, a local `Policy`), synchronously or
asynchronously, with or without real-time chunking. Imports numpy and the standard library only."""

from oxygen_jax.client.executor import MODES, Executor, ExecutorConfig, ExecutorStats, SimClock, Switch
from oxygen_jax.client.protocol import ChunkReply, rtc_request

__all__ = [
    "MODES",
    "ChunkReply",
    "Executor",
    "ExecutorConfig",
    "ExecutorStats",
    "SimClock",
    "Switch",
    "rtc_request",
]
