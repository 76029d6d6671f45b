"""The detour task's demonstrations as a LeRobot dataset (what `pi05_detour` is trained on): each episode
goes around the block on a side drawn at random, so the data holds both valid motions in equal share.

With recovery episodes (what `pi05_detour_prefix` is trained on), a share of the episodes shows how to get
back from having gone straight on past the split point: a model that continues a chunk whose first
actions are given (real-time chunking by conditioning) may inherit such an overshoot from the old chunk.
They keep only their frames past the split point, so that no frame teaches going straight on past it:
the split point itself is the usual episodes' turn.

The moving task's datasets carry a `min_clean_prefix` column (`MIN_CLEAN_PREFIX`: what `pi05_detour_moving`
trains with): 0 on demonstrations; episodes from where an rtc robot went (`evaluation.rtc_rollouts`) start
with the stale actions it executed, which their frames' least clean prefixes cover.
"""

import pathlib
from collections.abc import Iterable
from typing import Any

import numpy as np
import tqdm

from oxygen_jax.lerobot.writer import LeRobotWriter
from oxygen_jax.table_task import dataset, detour, moving_detour

# Episodes the shipped models were trained on (`oxygen-make-demo-dataset --task=detour`'s and
# `--task=detour_recovery`'s defaults); in the latter a third are recovery episodes.
TRAIN_SCENES = 600
RECOVERY_TRAIN_SCENES = 900
# `--task=detour_moving`'s default (`pi05_detour_moving`'s data), a third of them recovery episodes.
MOVING_TRAIN_SCENES = 900
# Where recovery episodes turn sideways: from just past the split point to just above the block.
RECOVERY_TURN_Y = (0.64, 0.76)
# The moving task's column of each frame's least clean prefix (`training/loss.py`).
MIN_CLEAN_PREFIX = "min_clean_prefix"
# An episode that starts with stale actions: its scene, gripper positions [n + 1, 2] (the last on the
# cube), the control step of the first, and how many actions of it are stale.
StaleEpisode = tuple[moving_detour.MovingDetourScene, np.ndarray, int, int]


def record_dataset(
    root: str | pathlib.Path,
    num_scenes: int,
    seed: int = detour.TRAIN_SEED,
    recovery_scenes: int = 0,
    moving: bool = False,
    stale_episodes: Iterable[StaleEpisode] = (),
) -> pathlib.Path:
    """`num_scenes` episodes, the last `recovery_scenes` of them recovery ones: every position of a
    demonstration, then `HOLD_STEPS` frames at the cube; the gripper position as state, the next one as
    action. The usual episodes are the same with or without recovery ones. moving: the moving detour
    task's (`moving_detour`: its scenes, each frame showing the cube where it is at that step), with the
    `MIN_CLEAN_PREFIX` column and `stale_episodes` after the others."""
    if not 0 <= recovery_scenes <= num_scenes:
        raise ValueError(f"recovery_scenes must be in [0, {num_scenes}], got {recovery_scenes}")
    stale_episodes = list(stale_episodes)
    if stale_episodes and not moving:
        raise ValueError("stale episodes are the moving task's: pass moving=True")
    stale = 0 if moving else None
    writer = LeRobotWriter(root, fps=dataset.FPS, robot_type="table")
    stream = (moving_detour if moving else detour).scenes(seed)
    sides = np.random.default_rng(seed + 1)
    for _ in tqdm.trange(num_scenes - recovery_scenes, desc="recording detour episodes", unit="episode"):
        scene = next(stream)
        _record_episode(writer, scene, scene.path(detour.SIDES[int(sides.integers(2))]), stale=stale)
    # A stream of its own, so that the usual episodes stay `--task=detour`'s.
    recovery = np.random.default_rng(seed + 7)
    for _ in tqdm.trange(recovery_scenes, desc="recording recovery episodes", unit="episode"):
        scene = next(stream)
        side = detour.SIDES[int(recovery.integers(2))]
        path = scene.recovery_path(side, turn_y=recovery.uniform(*RECOVERY_TURN_Y))
        past_split = int(np.argmax(path[:, 1] < detour.SPLIT_Y - 1e-6))
        _record_episode(writer, scene, path, first=past_split, stale=stale)
    for scene, path, start_step, executed in tqdm.tqdm(stale_episodes, desc="recording stale episodes"):
        _record_episode(writer, scene, path, start_step=start_step, stale=executed)
    return writer.root


def record_recovery_dataset(
    root: str | pathlib.Path, num_scenes: int, seed: int = detour.TRAIN_SEED
) -> pathlib.Path:
    """`record_dataset` with a third of the episodes recovery ones (`pi05_detour_prefix`'s data)."""
    return record_dataset(root, num_scenes, seed, recovery_scenes=num_scenes // 3)


def record_moving_dataset(
    root: str | pathlib.Path,
    num_scenes: int,
    seed: int = detour.TRAIN_SEED,
    stale_episodes: Iterable[StaleEpisode] = (),
) -> pathlib.Path:
    """The moving detour task's episodes, a third of them recovery ones, then `stale_episodes`
    (`pi05_detour_moving`'s data)."""
    return record_dataset(
        root, num_scenes, seed, recovery_scenes=num_scenes // 3, moving=True, stale_episodes=stale_episodes
    )


def _record_episode(
    writer: LeRobotWriter,
    scene: detour.DetourScene | moving_detour.MovingDetourScene,
    path: np.ndarray,
    first: int = 0,
    start_step: int = 0,
    stale: int | None = None,
) -> None:
    """Frames `first` on of `path` (its first position at control step `start_step`) followed by
    `HOLD_STEPS` positions on the cube (following a moving one). stale: the stale actions `path` starts
    with, in each frame's `MIN_CLEAN_PREFIX` (None: no such column)."""
    if isinstance(scene, moving_detour.MovingDetourScene):
        end = start_step + len(path) - 1
        hold = [scene.goal_at(end + step) for step in range(1, detour.HOLD_STEPS + 1)]
        observe = scene.observation
    else:
        hold = [path[-1]] * detour.HOLD_STEPS

        def observe(gripper: np.ndarray, step: int) -> dict[str, Any]:
            return scene.observation(gripper)  # a still scene: the same at every step

    positions = np.concatenate([path, np.asarray(hold, np.float32)])
    for step in range(first, len(positions)):
        action = positions[min(step + 1, len(positions) - 1)]
        data = frame(observe(positions[step], start_step + step), action)
        if stale is not None:
            data[MIN_CLEAN_PREFIX] = np.float32(max(stale - step, 0))
        writer.add_frame(data, task=detour.PROMPT)
    writer.save_episode()


def frame(obs: dict[str, Any], action: np.ndarray) -> dict[str, Any]:
    """One dataset frame: the observation the robot sends (a scene's `observation`) and the action."""
    return {
        "observation.image": obs["observation/image"],
        "observation.state": obs["observation/state"],
        "action": np.asarray(action, np.float32),
    }
