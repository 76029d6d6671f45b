"""How many decode steps k to run in a frame.

`FixedK` always answers the same k. `DeadlineK` holds a target action rate: it learns online the action
path's time (prefill + denoise) and the decode cost as a line t(k) = fixed + k * per_step, and picks the
largest k whose predicted frame time fits the budget, so language throughput is as high as the action
deadline allows.
"""

import collections
import dataclasses

import numpy as np


class FixedK:
    def __init__(self, k: int):
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        self.k = k

    def choose(self) -> int:
        return self.k

    def observe_frame(self, action_s: float, decode_s: float, k: int, other_s: float) -> None:
        """Fixed k learns nothing."""


@dataclasses.dataclass
class DeadlineK:
    """k for a frame budget of 1 / target_hz seconds.

    min_k (default 1) keeps language moving even when the action path alone fills the budget; max_k caps
    k (the most tokens a request can still need). `margin` is the fraction of the budget planned for.
    """

    target_hz: float
    max_k: int
    min_k: int = 1
    margin: float = 0.9
    window: int = 64

    def __post_init__(self):
        if self.target_hz <= 0:
            raise ValueError(f"target_hz must be > 0, got {self.target_hz}")
        self._action = collections.deque(maxlen=self.window)
        self._other = collections.deque(maxlen=self.window)
        self._decode = collections.deque(maxlen=self.window)  # (k, seconds)

    @property
    def budget_s(self) -> float:
        return 1.0 / self.target_hz

    def decode_model(self) -> tuple[float, float]:
        """(fixed seconds, seconds per step) of decode(k), least squares over recent frames."""
        if not self._decode:
            return 0.0, 0.0
        ks, ts = np.array(self._decode, dtype=float).T
        if len(set(ks)) < 2:
            return 0.0, float(np.sum(ts) / max(np.sum(ks), 1.0))
        per_step, fixed = np.polyfit(ks, ts, 1)
        return max(float(fixed), 0.0), max(float(per_step), 1e-9)

    def choose(self) -> int:
        if not self._action:
            return self.min_k  # first frame: measure before planning
        fixed, per_step = self.decode_model()
        if per_step == 0.0:
            return self.min_k
        spare = (
            self.budget_s * self.margin
            - float(np.median(self._action))
            - float(np.median(self._other))
            - fixed
        )
        return int(np.clip(np.floor(spare / per_step), self.min_k, self.max_k))

    def observe_frame(self, action_s: float, decode_s: float, k: int, other_s: float) -> None:
        self._action.append(action_s)
        self._other.append(other_s)
        if k > 0:
            self._decode.append((k, decode_s))
