"""How many decode steps k to run at once: per frame (frame loop) or per chunk (device loop).

`FixedK` always answers the same k. The other two learn online what the action path (prefill + denoise)
and a decode chunk cost, the latter as a line t(k) = fixed + k * per_step (`DecodeCost`), and pick the
largest k that fits a time budget:
- `DeadlineK` (frame loop) holds a target action rate: the action path, the host overhead and decode(k)
  together fit one frame period;
- `DelayBoundK` (device loop) bounds how long an arriving observation can wait behind a decode chunk:
  decode(k) fits `max_delay_s`, by default a fraction of the measured action path.
"""

import collections
import dataclasses
import logging

import numpy as np

logger = logging.getLogger(__name__)


class DecodeCost:
    """decode(k) seconds as a line `fixed + k * per_step`, least squares over the last `window` chunks."""

    def __init__(self, window: int = 64):
        self._chunks = collections.deque(maxlen=window)  # (k, seconds)

    def observe(self, k: int, seconds: float) -> None:
        if k > 0:
            self._chunks.append((k, seconds))

    def line(self) -> tuple[float, float]:
        """(fixed seconds, seconds per step); (0, 0) before any chunk was measured."""
        if not self._chunks:
            return 0.0, 0.0
        ks, ts = np.array(self._chunks, dtype=float).T
        if len(set(ks)) < 2:
            return 0.0, float(np.sum(ts) / max(np.sum(ks), 1.0))
        per_step, fixed = np.polyfit(ks, ts, 1)
        return max(float(fixed), 0.0), max(float(per_step), 1e-9)

    def seconds(self, k: int) -> float:
        """Predicted seconds of a k-step chunk (0 before any chunk was measured)."""
        fixed, per_step = self.line()
        return fixed + k * per_step if per_step else 0.0

    def steps_within(self, budget_s: float, min_k: int, max_k: int) -> int:
        """The largest k in [min_k, max_k] whose predicted chunk time fits `budget_s` (min_k unmeasured)."""
        fixed, per_step = self.line()
        if per_step == 0.0:
            return min_k
        steps = (budget_s - fixed) / per_step + 1e-6  # a fitted line's rounding must not cost a step
        return int(np.clip(np.floor(steps), min_k, max_k))


class FixedK:
    def __init__(self, k: int):
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        self.k = k

    def choose(self) -> int:
        return self.k

    def observe_action(self, action_s: float, other_s: float = 0.0) -> None:
        """Fixed k learns nothing."""

    def observe_decode(self, k: int, decode_s: float) -> None:
        """Fixed k learns nothing."""


@dataclasses.dataclass
class DeadlineK:
    """k for a frame budget of 1 / target_hz seconds.

    min_k (default 1) keeps language moving even when the action path alone fills the budget; max_k caps
    k (the most tokens a request can still need). `margin` is the fraction of the budget planned for.
    A target that even min_k overruns is warned about once (after `settle_frames` measured frames), with
    the rate the measured frame allows.
    """

    target_hz: float
    max_k: int
    min_k: int = 1
    margin: float = 0.9
    window: int = 64
    settle_frames: int = 3

    def __post_init__(self):
        if self.target_hz <= 0:
            raise ValueError(f"target_hz must be > 0, got {self.target_hz}")
        self._warned = False
        self._action = collections.deque(maxlen=self.window)
        self._other = collections.deque(maxlen=self.window)
        self.cost = DecodeCost(self.window)

    @property
    def budget_s(self) -> float:
        return 1.0 / self.target_hz

    def choose(self) -> int:
        if not self._action:
            return self.min_k  # first frame: measure before planning
        host_s = float(np.median(self._action)) + float(np.median(self._other))
        if not self._warned and len(self._action) >= self.settle_frames:
            self._warn_if_unreachable(host_s)
        return self.cost.steps_within(self.budget_s * self.margin - host_s, self.min_k, self.max_k)

    def _warn_if_unreachable(self, host_s: float) -> None:
        frame_s = host_s + self.cost.seconds(self.min_k)
        if frame_s > self.budget_s:
            self._warned = True
            logger.warning(
                "target rate %g Hz is out of reach: a frame takes %.1f ms with the fewest decode steps "
                "(actions and host %.1f ms), so at most %.1f Hz; running at k=%d",
                self.target_hz,
                frame_s * 1e3,
                host_s * 1e3,
                1.0 / frame_s,
                self.min_k,
            )

    def observe_action(self, action_s: float, other_s: float = 0.0) -> None:
        self._action.append(action_s)
        self._other.append(other_s)

    def observe_decode(self, k: int, decode_s: float) -> None:
        self.cost.observe(k, decode_s)


@dataclasses.dataclass
class DelayBoundK:
    """k such that one decode chunk takes at most `max_delay_s` (None: `action_fraction` of the median
    measured action path), so an observation arriving during a chunk waits at most that long.

    The decode cost grows with the batch, so the line is fit over a short recent window.
    """

    max_k: int
    max_delay_s: float | None = None
    action_fraction: float = 0.1
    min_k: int = 1
    window: int = 16

    def __post_init__(self):
        if self.max_delay_s is not None and self.max_delay_s <= 0:
            raise ValueError(f"max_action_delay must be > 0, got {self.max_delay_s * 1e3:g} ms")
        self._action = collections.deque(maxlen=64)
        self.cost = DecodeCost(self.window)

    @property
    def delay_budget_s(self) -> float | None:
        """The bound in force: the fixed one, or the fraction of the action path measured so far."""
        if self.max_delay_s is not None:
            return self.max_delay_s
        return self.action_fraction * float(np.median(self._action)) if self._action else None

    def choose(self) -> int:
        budget = self.delay_budget_s
        return self.min_k if budget is None else self.cost.steps_within(budget, self.min_k, self.max_k)

    def observe_action(self, action_s: float, other_s: float = 0.0) -> None:
        self._action.append(action_s)

    def observe_decode(self, k: int, decode_s: float) -> None:
        self.cost.observe(k, decode_s)


KPolicy = FixedK | DeadlineK | DelayBoundK
