"""One robot's policy choosing each chunk by bidirectional decoding (`policies/bid.py`), the baseline
real-time chunking is compared with: no guidance, N plain samples per request and the one kept that agrees
with what the robot executes and contrasts with a weaker model's samples.

The robot runs as with real-time chunking (`rtc` entries: executed, delay, horizon; it keeps the old chunk
up to the reply's `start`), and the server keeps its chunks in the same `RobotChunks`. The weak model is
the same model with fewer denoising steps, on the same noise and the same prefix cache. A request without
`rtc` has no previous chunk: it keeps the densest sample (`chunk_choice`), as `RtcPolicy` with
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
from oxygen_jax.models import inputs
from oxygen_jax.policies import bid, chunk_choice
from oxygen_jax.policies.policy import Policy
from oxygen_jax.policies.request_options import RequestOptions
from oxygen_jax.policies.rtc import GuidanceSettings, RobotChunks, draw_samples


def default_weak_steps(num_steps: int) -> int:
    """The weak model's denoising steps: a fifth of the strong one's (at least 1). Few Euler steps land
    near the mean of the motions the noise could lead to, the chunk between them BID should avoid."""
    return max(1, num_steps // 5)


class BidPolicy:
    """`RtcPolicy`'s interface, each chunk chosen by BID among `samples` (>= 2). Thread-safe."""

    def __init__(self, policy: Policy, *, samples: int, schedule: str = "exp", weak_steps: int | None = None):
        if samples < 2:
            raise InvalidArgumentError(f"bid needs at least 2 samples per request, got {samples}")
        self._policy = policy
        self._lock = threading.Lock()
        self.chunks = RobotChunks(schedule=schedule)
        self.samples = samples
        self.weak_steps = default_weak_steps(policy.num_steps) if weak_steps is None else weak_steps

    @property
    def metadata(self) -> dict[str, Any]:
        return self._policy.metadata

    def infer(self, obs: Mapping[str, Any], *, noise: np.ndarray) -> dict[str, Any]:
        """The kept chunk's reply plus chunk_id, start and stale (as `RtcPolicy.infer`); `noise`:
        [samples, H, action_dim], shared by the strong and the weak samples."""
        arrival = self.chunks.arrive()
        rtc = obs.get(protocol.RTC)
        obs = {k: v for k, v in obs.items() if k != protocol.RTC}
        engine = self._policy.engine
        with self._lock:
            began = time.monotonic()
            guidance, start = self.chunks.guidance(rtc, engine.config.action_horizon)
            prepared = self._policy.prepare(obs, RequestOptions(noise=noise, samples=self.samples))
            cache = engine.prefill(inputs.observation_from_arrays(prepared.arrays, engine.config))
            rows = engine.select_rows(cache, np.zeros(self.samples, np.int32))
            noise = prepared.noise
            strong = np.asarray(engine.denoise(rows, noise, self._policy.num_steps))
            executed = np.stack([self._policy.finish(prepared, chunk)["actions"] for chunk in strong])
            if guidance is None:
                kept = chunk_choice.densest(executed)
            else:
                weak = np.asarray(engine.denoise(rows, noise, self.weak_steps))
                weak_executed = np.stack([self._policy.finish(prepared, chunk)["actions"] for chunk in weak])
                planned = guidance.planned
                weights = prefix_weights(planned.delay, planned.horizon, len(strong[0]), planned.schedule)
                kept = bid.select(executed, weak_executed, guidance.executed, weights)
            reply = self._policy.finish(prepared, strong[kept])
            return {
                **reply,
                **self.chunks.answered(arrival, strong[kept], reply["actions"], time.monotonic() - began),
                protocol.START: start,
            }


def seeded_infer(
    policy: Policy, guidance: GuidanceSettings, rng: np.random.Generator
) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """`rtc.seeded_infer` for BID: a fresh one-robot `BidPolicy` drawing `fresh_samples` chunks at every
    request, the first one's noise from `rng` (the stream every mode shares), the others' from a stream
    spawned off it."""
    guidance = guidance.for_policy(policy)
    served = BidPolicy(policy, samples=guidance.fresh_samples, schedule=guidance.schedule)
    shape = (policy.engine.config.action_horizon, policy.engine.config.action_dim)
    others = rng.spawn(1)[0]

    def infer(obs: Mapping[str, Any]) -> dict[str, Any]:
        return served.infer(obs, noise=draw_samples(rng, others, shape, guidance.noise_dims, served.samples))

    return infer
