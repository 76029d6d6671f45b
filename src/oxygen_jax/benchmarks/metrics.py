"""Run statistics of the frame loop: action rate, latency percentiles, language throughput, memory."""

import dataclasses
import resource
import sys

import jax
import numpy as np

from oxygen_jax.runtime.scheduler import FrameResult


def peak_memory_bytes() -> int:
    """Peak device memory where the backend reports it (GPU), else this process's peak RSS (CPU)."""
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return int(stats["peak_bytes_in_use"])
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


@dataclasses.dataclass
class RunStats:
    """Accumulates frames. Only frames that emitted actions count toward the action rate."""

    frames: list[FrameResult] = dataclasses.field(default_factory=list)
    tokens: int = 0
    completed: int = 0

    def add(self, result: FrameResult) -> None:
        self.frames.append(result)
        self.tokens += result.new_tokens
        self.completed += len(result.finished)

    @property
    def wall_s(self) -> float:
        return sum(f.total_s for f in self.frames)

    def live(self) -> dict[str, float]:
        """Figures for a progress bar."""
        wall = max(self.wall_s, 1e-9)
        acting = [f for f in self.frames if f.actions]
        return {"action_hz": len(acting) / wall, "tok/s": self.tokens / wall}

    def summary(self) -> dict[str, float | int]:
        acting = [f for f in self.frames if f.actions]
        frame_ms = np.array([f.total_s for f in acting]) * 1e3 if acting else np.zeros(1)
        decoding = [f for f in self.frames if f.k]
        wall = max(self.wall_s, 1e-9)
        return {
            "frames": len(acting),
            "frames_total": len(self.frames),
            "requests_completed": self.completed,
            "action_hz": len(acting) / max(sum(f.total_s for f in acting), 1e-9),
            "frame_ms_mean": float(frame_ms.mean()),
            "frame_ms_p50": float(np.percentile(frame_ms, 50)),
            "frame_ms_p99": float(np.percentile(frame_ms, 99)),
            "action_ms_mean": float(np.mean([f.action_s for f in acting]) * 1e3) if acting else 0.0,
            "tokens": self.tokens,
            "tokens_per_s": self.tokens / wall,
            "avg_batch": float(np.mean([f.decode_batch for f in decoding])) if decoding else 0.0,
            "avg_k": float(np.mean([f.k for f in decoding])) if decoding else 0.0,
        }
