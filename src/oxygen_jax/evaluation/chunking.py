"""Action chunking: one policy call per `replan_steps` control steps, as openpi's evaluation loops."""

import collections
import dataclasses
import time
from collections.abc import Callable

import numpy as np

from oxygen_jax.evaluation import console
from oxygen_jax.evaluation.policies import EvalPolicy
from oxygen_jax.evaluation.recording import EpisodeRecorder, recorded_frame
from oxygen_jax.evaluation.requirements import SetupError


@dataclasses.dataclass(frozen=True)
class Replan:
    """One policy call of a rollout: when, how long it took, and what the model said."""

    step: int
    latency_ms: float
    text: str | None


def keep_replan(replans: list[Replan], replan: Replan | None) -> None:
    """Adds a control step's policy call (None: the step made none) to its rollout's `replans` and shows
    what the model said."""
    if replan is None:
        return
    replans.append(replan)
    if replan.text is not None:
        console.echo(f"  step {replan.step}: {replan.text!r}")


class ActionChunker:
    """Queries the policy every `replan_steps` control steps and executes the head of each chunk, as
    openpi's LIBERO loop and `ActionChunkBroker` do; the rest of each chunk is dropped.

    With a `recorder`, every control step's observation, executed action and the policy's latest text
    are recorded (the observation is then built every step, not only at replans); `end_episode` closes
    the recorded episode."""

    def __init__(
        self, policy: EvalPolicy, replan_steps: int, recorder: EpisodeRecorder | None = None
    ) -> None:
        if replan_steps < 1:
            raise ValueError(f"replan_steps must be >= 1, got {replan_steps}")
        horizon = policy.metadata.get("action_horizon")
        if horizon is not None and replan_steps > horizon:
            raise SetupError(f"replan_steps {replan_steps} exceeds the policy's action horizon {horizon}")
        self._policy = policy
        self._replan_steps = replan_steps
        self._plan: collections.deque[np.ndarray] = collections.deque()
        self._recorder = recorder
        self._recorded = 0
        self._text = ""

    def reset(self) -> None:
        self._plan.clear()
        self._text = ""

    def end_episode(self) -> None:
        """Saves the recorded episode (nothing without a recorder or recorded steps)."""
        if self._recorder is not None and self._recorded:
            self._recorder.save_episode()
        self._recorded = 0

    def act(self, step: int, make_obs: Callable[[], dict]) -> tuple[np.ndarray, Replan | None]:
        """The action for this step; builds the observation (and replans) only when the plan is empty,
        or every step when recording."""
        replan = None
        obs = make_obs() if self._recorder is not None else None
        if not self._plan:
            start = time.perf_counter()
            result = self._policy.infer(make_obs() if obs is None else obs)
            latency_ms = (time.perf_counter() - start) * 1000
            chunk = np.asarray(result["actions"])
            if chunk.ndim != 2 or len(chunk) < self._replan_steps:
                raise ValueError(
                    f"expected an action chunk [H >= {self._replan_steps}, dims], got {list(chunk.shape)}"
                )
            self._plan.extend(chunk[: self._replan_steps])
            text = result.get("text")
            replan = Replan(step, latency_ms, None if text is None else str(text))
            self._text = self._text if text is None else str(text)
        action = self._plan.popleft()
        if obs is not None:
            self._recorder.add_frame(recorded_frame(obs, action, self._text), task=str(obs.get("prompt", "")))
            self._recorded += 1
        return action, replan
