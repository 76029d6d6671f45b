"""Control rate: the rate a loop achieved, and holding a loop to a real robot's rate."""

import time


class RateMeter:
    """Achieved control rate: control steps per second of wall time, inference and simulation included."""

    def __init__(self) -> None:
        self._start = time.perf_counter()
        self.steps = 0

    def tick(self) -> None:
        self.steps += 1

    @property
    def hz(self) -> float:
        elapsed = time.perf_counter() - self._start
        return self.steps / elapsed if elapsed > 0 else 0.0


class Pacer:
    """Holds a loop to `hz` (a real robot's control rate) and counts the steps that overran it."""

    def __init__(self, hz: float) -> None:
        self._period = 1.0 / hz
        self._deadline = time.perf_counter() + self._period
        self.late_steps = 0

    def wait(self) -> None:
        remaining = self._deadline - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)
        else:
            self.late_steps += 1
        # A late step restarts the schedule instead of rushing the next ones to catch up.
        self._deadline = max(self._deadline, time.perf_counter()) + self._period
