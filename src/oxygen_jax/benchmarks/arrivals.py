"""Language request arrival patterns of the OxyGen experiments, as per-frame request lengths."""

import dataclasses

import numpy as np

KINDS = ("uniform", "poisson", "random_length")


@dataclasses.dataclass
class ArrivalPattern:
    """uniform: `rate` requests per frame (rate < 1: one every 1/rate frames); poisson: Poisson(rate)
    per frame; random_length: uniform arrivals whose length is `lengths[1]` with probability
    `long_fraction`, else `lengths[0]`. Other kinds ask for `lengths[-1]` tokens."""

    kind: str = "uniform"
    rate: float = 1.0
    lengths: tuple[int, ...] = (30,)
    long_fraction: float = 0.5
    seed: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"arrivals must be one of {KINDS}, got {self.kind!r}")
        if self.rate <= 0:
            raise ValueError(f"arrival rate must be > 0, got {self.rate}")
        if self.kind == "random_length" and len(self.lengths) != 2:
            raise ValueError(f"random_length needs two lengths (short, long), got {self.lengths}")
        self._rng = np.random.default_rng(self.seed)

    def _count(self, frame: int) -> int:
        if self.kind == "poisson":
            return int(self._rng.poisson(self.rate))
        if self.rate >= 1:
            return round(self.rate)
        return int(frame % round(1 / self.rate) == 0)

    def lengths_at(self, frame: int) -> list[int]:
        """max_new_tokens of each request arriving at `frame`."""
        count = self._count(frame)
        if self.kind != "random_length":
            return [self.lengths[-1]] * count
        long = self._rng.random(count) < self.long_fraction
        return [self.lengths[1] if is_long else self.lengths[0] for is_long in long]
