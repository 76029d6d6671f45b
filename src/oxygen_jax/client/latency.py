"""Inference latencies that wander, for the simulated control loop (`client/simulated.py`).

A real server's latency varies from request to request (batching with other robots, compilation, the
network), and the robot's estimate of it, the delay d it sends with `rtc`, may be wrong. Each request's
latency in control steps is drawn around the nominal d:
- `none`: exactly d;
- `uniform`: uniform on [d/2, 3d/2] (+-50 %);
- `heavy_tail`: d times a Pareto variable of shape 3 scaled to mean 1: never below 2d/3, above 2d for
  3.7 % of the requests and above 3d for 1.1 %, a few very late replies;
- `served`: replayed from a served run (`evaluation/served_loop.py`'s results.json): drawn from the
  control ticks its robot advanced while each request was out, fresh requests' (below) apart.
A request that continues no chunk (each episode's first with rtc, every one with sync and naive) draws
the config's first-chunk samples, and on a server that takes longer: its latency can be drawn around a
nominal of its own (`fresh_delay`), as measured against a running server (`evaluation/served_loop.py`).
A reply later than the robot's estimate switches where the executor's rules say: at the index it
reached, skipping the new chunk's actions for the ticks already executed (rtc, naive); one later than the
actions left makes the robot wait.
"""

import dataclasses
import json
import pathlib
from collections.abc import Callable, Mapping

import numpy as np

from oxygen_jax.client import protocol
from oxygen_jax.errors import InvalidArgumentError

JITTERS = ("none", "uniform", "heavy_tail", "served")
PARETO_SHAPE = 3.0  # the heavy tail's: finite mean and variance, P(X > x) ~ x^-3


@dataclasses.dataclass(frozen=True)
class LatencySettings:
    """jitter: how each request's latency is drawn around its nominal (`JITTERS`); delay_estimate: the
    d the robot sends with `rtc` (None: the nominal d); fresh_delay: the nominal latency in control steps
    of a request that continues no chunk (None: d, as every other); served: the latencies `served`
    replays."""

    jitter: str = "none"
    delay_estimate: int | None = None
    fresh_delay: float | None = None
    served: "ServedLatencies | None" = None

    def check(self, horizon: int) -> None:
        """InvalidArgumentError (one line) for a jitter it does not know or an estimate outside [0, H)."""
        if self.jitter not in JITTERS:
            raise InvalidArgumentError(_unknown(self.jitter))
        if (self.jitter == "served") != (self.served is not None):
            raise InvalidArgumentError(
                "latency_jitter=served and latencies_from (the served run it replays) go together"
            )
        if self.served is not None and self.fresh_delay is not None:
            raise InvalidArgumentError("a served run's latencies include its fresh requests': no fresh_delay")
        if self.delay_estimate is not None and not 0 <= self.delay_estimate < horizon:
            raise InvalidArgumentError(
                f"delay_estimate must lie in [0, {horizon - 1}], got {self.delay_estimate}"
            )
        if self.fresh_delay is not None and not 0 <= self.fresh_delay < float("inf"):
            raise InvalidArgumentError(f"fresh_delay must be finite and >= 0, got {self.fresh_delay}")

    def nominal(self, request: Mapping, delay_steps: int) -> float:
        """The latency `request` is drawn around: `fresh_delay` if it continues no chunk, else d."""
        if self.fresh_delay is None or protocol.continues_chunk(request):
            return float(delay_steps)
        return self.fresh_delay

    def drawer(self, delay_steps: int, rng: np.random.Generator) -> Callable[[Mapping], float]:
        """Draws each request's latency in control steps (`simulated.DelayedRequests`'s latency_steps)."""
        if self.served is not None:
            return lambda request: self.served.draw(not protocol.continues_chunk(request), rng)
        return lambda request: draw(self.jitter, self.nominal(request, delay_steps), rng)

    def fields(self) -> dict:
        """Its results.json fields."""
        return {
            "latency_jitter": self.jitter,
            "delay_estimate": self.delay_estimate,
            "fresh_delay_steps": self.fresh_delay,
            "latencies_from": None if self.served is None else self.served.source,
        }


@dataclasses.dataclass(frozen=True)
class ServedLatencies:
    """How many of a served run's replies came after each number of control ticks: those to requests that
    continue a chunk and those to fresh ones (rtc: each episode's first; sync and naive: all)."""

    continuing: Mapping[int, int]
    fresh: Mapping[int, int]
    source: str

    @classmethod
    def load(cls, path: str | pathlib.Path) -> "ServedLatencies":
        """From a served run's results.json (`oxygen-eval-table --policy=remote`)."""
        try:
            results = json.loads(pathlib.Path(path).read_text())
            histograms = [results[f"{kind}_ticks_histogram"] for kind in ("latency", "fresh_latency")]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise InvalidArgumentError(
                f"{path}: not the results.json of a served run with its latency histograms ({error!r})"
            ) from None
        continuing, fresh = ({int(k): int(n) for k, n in h.items()} for h in histograms)
        if not continuing and not fresh:
            raise InvalidArgumentError(f"{path}: the served run measured no latency")
        return cls(continuing or fresh, fresh or continuing, str(path))

    def draw(self, fresh: bool, rng: np.random.Generator) -> float:
        histogram = self.fresh if fresh else self.continuing
        steps, counts = zip(*sorted(histogram.items()), strict=True)
        return float(rng.choice(steps, p=np.asarray(counts) / sum(counts)))


NO_JITTER = LatencySettings()


def draw(jitter: str, delay_steps: float, rng: np.random.Generator) -> float:
    """One request's latency in control steps around `delay_steps` (a float: the reply is there at the
    first tick after it)."""
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
