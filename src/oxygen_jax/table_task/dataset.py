"""The demo task's scripted episodes as a LeRobot dataset, the format every config trains on: the gripper
moving straight to the named cube, the subtask text on every frame."""

import pathlib
from typing import Any

import tqdm

from oxygen_jax.lerobot.writer import LeRobotWriter
from oxygen_jax.table_task import scenes

FPS = 10
# Episodes the shipped model was trained on (`scripts/make_demo_dataset.py`'s default).
TRAIN_SCENES = 4000


def record_dataset(root: str | pathlib.Path, num_scenes: int, seed: int = scenes.TRAIN_SEED) -> pathlib.Path:
    """`num_scenes` episodes of `STEPS + 1` frames: the image, the gripper position as state, the next
    position as action, the subtask text; the prompt is the episode's task."""
    writer = LeRobotWriter(root, fps=FPS, robot_type="table")
    stream = scenes.scenes(seed)
    for _ in tqdm.trange(num_scenes, desc="recording demo episodes", unit="episode"):
        scene = next(stream)
        for step in range(scenes.STEPS + 1):
            writer.add_frame(frame(scene, step), task=scene.prompt)
        writer.save_episode()
    return writer.root


def frame(scene: Any, step: int) -> dict[str, Any]:
    """One dataset frame of a scene: its image, the gripper position as state, the next one as action."""
    obs = scene.observation(step)
    return {
        "observation.image": obs["observation/image"],
        "observation.state": obs["observation/state"],
        "action": scene.gripper(step + 1),
        "subtask": scene.subtask,
    }
