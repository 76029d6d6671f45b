"""What one benchmark run is: mode, robot layout, model settings and the language workload.

A spec is plain data (picklable, JSON-able) so worker processes rebuild the identical run from it: the
same synthetic observations and the same request schedule in every mode, so modes differ only in how
they serve the work.
"""

import dataclasses
import math

import numpy as np

from oxygen_jax.benchmarks import arrivals
from oxygen_jax.benchmarks.observations import LAYOUTS
from oxygen_jax.models import inputs
from oxygen_jax.models.pi05 import Pi05Config

MODES = ("isolated", "parallel", "shared_kv", "oxygen", "action_only")

_PROMPT_LEN = {"libero": 48, "droid": 40, "aloha": 64}  # typical pi0.5 prompt + discretized state


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One measured run. `target_hz` set: oxygen picks k online (deadline-aware), else k is fixed.

    Requests ask for `max_new` tokens (random_length: `lengths` = (short, long)); `fill` frames run
    before the `frames` measured ones so continuous batching is in steady state when measuring starts.
    """

    mode: str
    layout: str = "libero"
    num_steps: int = 10
    max_new: int = 30
    k: int = 5
    target_hz: float | None = None
    arrivals: str = "uniform"
    rate: float = 1.0
    lengths: tuple[int, ...] = ()
    long_fraction: float = 0.5
    frames: int = 20
    skip_masked_cameras: bool = True
    max_slots: int = 0  # 0: enough for the mean load, see `slots`
    seed: int = 0
    sweep: str = "ablation"

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {sorted(LAYOUTS)}, got {self.layout!r}")

    @property
    def name(self) -> str:
        """A file stem unique per setting (frames excluded: a rerun replaces the older result)."""
        k = f"hz{self.target_hz:g}" if self.target_hz else f"k{self.k}"
        load = f"{self.arrivals}{self.rate:g}"
        if self.arrivals == "random_length":
            load += f"_len{'-'.join(map(str, self.lengths))}_long{self.long_fraction:g}"
        skip = "" if self.skip_masked_cameras else "_noskip"
        return f"{self.sweep}_{self.mode}_{self.layout}_S{self.num_steps}_N{self.max_new}_{k}_{load}{skip}"

    @property
    def request_lengths(self) -> tuple[int, ...]:
        return self.lengths if self.arrivals == "random_length" else (self.max_new,)

    @property
    def longest(self) -> int:
        return max(self.request_lengths)

    @property
    def fill(self) -> int:
        return math.ceil(self.longest / max(self.k, 1))

    @property
    def slots(self) -> int:
        """Batch state slots: the steady-state number of requests in flight (rate x frames each takes)."""
        if self.max_slots:
            return self.max_slots
        return max(1, math.ceil(self.rate * self.fill))

    def schedule(self) -> list[list[int]]:
        """Lengths of the requests arriving at each frame (fill frames first), identical in every mode."""
        pattern = arrivals.ArrivalPattern(
            self.arrivals, self.rate, self.request_lengths, self.long_fraction, self.seed
        )
        return [pattern.lengths_at(frame) for frame in range(self.fill + self.frames)]


def observation(config: Pi05Config, layout: str, frame: int) -> dict[str, np.ndarray]:
    """Frame `frame`'s synthetic observation (batch dim 1): random images, the layout's camera masks."""
    arrays = inputs.synthetic_arrays(config, 1, _PROMPT_LEN[layout], seed=frame)
    for cam in config.image_keys:
        arrays[f"image_mask/{cam}"] = np.array([cam in LAYOUTS[layout]])
    del arrays["state"]
    return arrays
