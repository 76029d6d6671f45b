"""Recording episodes as a LeRobot dataset: every control step's observation, action and latest text."""

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from oxygen_jax.evaluation.requirements import SetupError


class EpisodeRecorder(Protocol):
    """Where a loop records its episodes (`lerobot.writer.LeRobotWriter`)."""

    def add_frame(self, frame: Mapping[str, Any], task: str) -> None: ...

    def save_episode(self) -> int: ...


def recorder_for(record_dir: str | None, fps: float, robot_type: str) -> EpisodeRecorder | None:
    """A LeRobot dataset writer into the new folder `record_dir`, or None without one."""
    if not record_dir:
        return None
    from oxygen_jax.lerobot.writer import LeRobotWriter

    try:
        return LeRobotWriter(record_dir, fps=fps, robot_type=robot_type)
    except FileExistsError as error:
        raise SetupError(str(error)) from error


def recorded_frame(obs: Mapping[str, Any], action: np.ndarray, text: str) -> dict[str, Any]:
    """One control step as dataset columns: the observation sent to the policy under its own keys (nested
    ones joined by "/", CHW images turned HWC, the prompt left to the episode's task), the executed
    `action` and the last `text` the policy said ("" before it said any)."""
    frame: dict[str, Any] = {}

    def add(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for key, item in value.items():
                add(f"{prefix}{key}/", item)
            return
        array = np.asarray(value)
        if array.dtype == np.uint8 and array.ndim == 3 and array.shape[0] == 3 and array.shape[-1] != 3:
            array = np.moveaxis(array, 0, -1)
        frame[prefix[:-1]] = array

    add("", {key: value for key, value in obs.items() if key != "prompt"})
    frame["action"] = np.asarray(action, np.float32)
    frame["text"] = text
    return frame
