"""The detour task's demonstrations as a LeRobot dataset (what `pi05_detour` is trained on): each episode
goes around the block on a side drawn at random, so the data holds both valid motions in equal share."""

import pathlib
from typing import Any

import numpy as np
import tqdm

from oxygen_jax.lerobot.writer import LeRobotWriter
from oxygen_jax.table_task import dataset, detour

# Episodes the shipped model was trained on (`scripts/make_demo_dataset.py --task=detour`'s default).
TRAIN_SCENES = 600


def record_dataset(root: str | pathlib.Path, num_scenes: int, seed: int = detour.TRAIN_SEED) -> pathlib.Path:
    """`num_scenes` episodes: every position of a demonstration, then `HOLD_STEPS` frames at the cube; the
    gripper position as state, the next one as action."""
    writer = LeRobotWriter(root, fps=dataset.FPS, robot_type="table")
    stream = detour.scenes(seed)
    sides = np.random.default_rng(seed + 1)
    for _ in tqdm.trange(num_scenes, desc="recording detour episodes", unit="episode"):
        scene = next(stream)
        path = scene.path(detour.SIDES[int(sides.integers(2))])
        positions = np.concatenate([path, np.repeat(path[-1:], detour.HOLD_STEPS, axis=0)])
        for step, gripper in enumerate(positions):
            writer.add_frame(
                frame(scene, gripper, positions[min(step + 1, len(positions) - 1)]), task=detour.PROMPT
            )
        writer.save_episode()
    return writer.root


def frame(scene: detour.DetourScene, gripper: np.ndarray, action: np.ndarray) -> dict[str, Any]:
    obs = scene.observation(gripper)
    return {
        "observation.image": obs["observation/image"],
        "observation.state": obs["observation/state"],
        "action": np.asarray(action, np.float32),
    }
