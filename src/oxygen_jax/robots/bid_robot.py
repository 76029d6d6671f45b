"""One robot's policy choosing each chunk by bidirectional decoding (`policies/bid.py`), the baseline
real-time chunking is compared with: no guidance, N plain samples per request and the one kept that agrees
with what the robot executes and contrasts with a weaker model's samples.

The robot runs as with real-time chunking (`rtc` entries: executed, delay, horizon; it keeps the old chunk
up to the reply's `start`), and the server keeps its chunks in the same `RobotChunks`. The weak model is
the same model with fewer denoising steps, on the same noise and the same prefix cache. A request without
`rtc` has no previous chunk: it keeps the densest sample (`chunk_choice`), as `LocalRobot` with
`fresh_samples` does.
"""

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from oxygen_jax.client import protocol
from oxygen_jax.engine.guidance import prefix_weights
from oxygen_jax.errors import InvalidArgumentError
from oxygen_jax.policies import bid, chunk_choice
from oxygen_jax.policies.policy import Policy
from oxygen_jax.policies.request_options import RequestOptions
from oxygen_jax.robots.robot import Robot
from oxygen_jax.robots.trial import GuidanceSettings, draw_samples


def default_weak_steps(num_steps: int) -> int:
    """The weak model's denoising steps: a fifth of the strong one's (at least 1). Few Euler steps land
    near the mean of the motions the noise could lead to, the chunk between them BID should avoid."""
    return max(1, num_steps // 5)


class BidRobot:
    """`LocalRobot`'s interface, each chunk chosen by BID among `samples` (>= 2). Thread-safe."""

    def __init__(self, policy: Policy, *, samples: int, schedule: str = "exp", weak_steps: int | None = None):
        if samples < 2:
            raise InvalidArgumentError(f"bid needs at least 2 samples per request, got {samples}")
        self.robot = Robot(policy, "robot-0", schedule=schedule)
        self._lock = threading.Lock()
        self.samples = samples
        self.weak_steps = default_weak_steps(policy.num_steps) if weak_steps is None else weak_steps

    @property
    def metadata(self) -> dict[str, Any]:
        return self.robot.policy.metadata

    def infer(self, obs: Mapping[str, Any], *, noise: np.ndarray) -> dict[str, Any]:
        """The kept chunk's reply with the `Robot` fields (`rtc_method` "bid" with `rtc`); `noise`:
        [samples, H, action_dim], shared by the strong and the weak samples."""
        rtc = obs.get(protocol.RTC)
        obs = {k: v for k, v in obs.items() if k != protocol.RTC}
        policy, inline = self.robot.policy, self.robot.policy.inline
        with self._lock:
            began = time.monotonic()
            turn = self.robot.prepare(obs, RequestOptions(noise=noise, samples=self.samples), rtc)
            self.robot.begin(turn)
            prepared, guidance = turn.prepared, turn.guidance
            cache, strong = inline.act(prepared.arrays, prepared.noise)  # unguided: BID only selects
            executed = np.stack([policy.finish(prepared, chunk)["actions"] for chunk in strong])
            if guidance is None:
                kept = chunk_choice.densest(executed)
            else:
                weak = inline.denoise(cache, prepared.noise, self.weak_steps)
                weak_executed = np.stack([policy.finish(prepared, chunk)["actions"] for chunk in weak])
                planned = guidance.planned
                weights = prefix_weights(planned.delay, planned.horizon, len(strong[0]), planned.schedule)
                kept = bid.select(executed, weak_executed, guidance.executed, weights)
            timing = {"infer_ms": (time.monotonic() - began) * 1000}
            return self.robot.finish(turn, strong[kept], timing, method="bid")


def seeded_infer(
    policy: Policy, guidance: GuidanceSettings, rng: np.random.Generator
) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """`trial.seeded_infer` for BID: a fresh `BidRobot` drawing `fresh_samples` chunks at every
    request, the first one's noise from `rng` (the stream every mode shares), the others' from a stream
    spawned off it."""
    guidance = guidance.for_policy(policy)
    served = BidRobot(policy, samples=guidance.fresh_samples, schedule=guidance.schedule)
    shape = (policy.engine.config.action_horizon, policy.engine.config.action_dim)
    others = rng.spawn(1)[0]

    def infer(obs: Mapping[str, Any]) -> dict[str, Any]:
        return served.infer(obs, noise=draw_samples(rng, others, shape, guidance.noise_dims, served.samples))

    return infer
