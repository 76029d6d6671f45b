"""Inference latencies that wander, for the simulated control loop (`client/simulated.py`).

A real server's latency varies from request to request (batching with other robots, compilation, the
network), and the robot's estimate of it, the delay d it sends with `rtc`, may be wrong. Each request's
latency in control steps is drawn around the nominal d:
- `none`: exactly d;
- `uniform`: uniform on [d/2, 3d/2] (+-50 %);
- `heavy_tail`: d times a Pareto variable of shape 3 scaled to mean 1: never below 2d/3, above 2d for
  3.7 % of the requests and above 3d for 1.1 %, a few very late replies.
A reply later than the robot's estimate switches where the executor's rules say: at the index it
reached, skipping the new chunk's actions for the ticks already executed (rtc, naive); one later than the
actions left makes the robot wait.
"""

import dataclasses

import numpy as np

from oxygen_jax.errors import InvalidArgumentError

JITTERS = ("none", "uniform", "heavy_tail")
PARETO_SHAPE = 3.0  # the heavy tail's: finite mean and variance, P(X > x) ~ x^-3


@dataclasses.dataclass(frozen=True)
class LatencySettings:
    """jitter: how each request's latency is drawn around the nominal d (`JITTERS`); delay_estimate: the
    d the robot sends with `rtc` (None: the nominal d)."""

    jitter: str = "none"
    delay_estimate: int | None = None

    def check(self, horizon: int) -> None:
        """InvalidArgumentError (one line) for a jitter it does not know or an estimate outside [0, H)."""
        if self.jitter not in JITTERS:
            raise InvalidArgumentError(_unknown(self.jitter))
        if self.delay_estimate is not None and not 0 <= self.delay_estimate < horizon:
            raise InvalidArgumentError(
                f"delay_estimate must lie in [0, {horizon - 1}], got {self.delay_estimate}"
            )

    def fields(self) -> dict:
        """Its results.json fields."""
        return {"latency_jitter": self.jitter, "delay_estimate": self.delay_estimate}


NO_JITTER = LatencySettings()


def draw(jitter: str, delay_steps: int, rng: np.random.Generator) -> float:
    """One request's latency in control steps (a float: the reply is there at the first tick after it)."""
    if jitter == "none":
        return float(delay_steps)
    if jitter == "uniform":
        return float(delay_steps * rng.uniform(0.5, 1.5))
    if jitter == "heavy_tail":
        scale = (PARETO_SHAPE - 1) / PARETO_SHAPE  # the Pareto's minimum, for mean 1
        return float(delay_steps * scale * (1.0 + rng.pareto(PARETO_SHAPE)))
    raise InvalidArgumentError(_unknown(jitter))


def _unknown(jitter: str) -> str:
    return f"latency_jitter must be one of {', '.join(JITTERS)}, got {jitter!r}"
