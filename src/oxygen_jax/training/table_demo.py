"""Data and scoring of the demo task (`evaluation.table_scenes`) for `pi05_demo`.

`record_dataset` writes scripted episodes (the gripper moving straight to the named cube, the subtask
text on every frame) as a LeRobot dataset, the format every config trains on. `evaluate` scores a policy
on held-out scenes: the text it says against the true subtask, and its action chunk against the true one.
"""

import pathlib
from typing import Any

import numpy as np
import tqdm

from oxygen_jax.evaluation import table_scenes
from oxygen_jax.training.data.lerobot_writer import LeRobotWriter

FPS = 10
# Episodes the shipped model was trained on (`scripts/make_demo_dataset.py`'s default).
TRAIN_SCENES = 4000
# Seeds of the scene streams: held-out scenes never appear in training data.
TRAIN_SEED = 0
HELD_OUT_SEED = 1_000_003


def record_dataset(root: str | pathlib.Path, num_scenes: int, seed: int = TRAIN_SEED) -> pathlib.Path:
    """`num_scenes` episodes of `STEPS + 1` frames: the image, the gripper position as state, the next
    position as action, the subtask text; the prompt is the episode's task."""
    writer = LeRobotWriter(root, fps=FPS, robot_type="table")
    scenes = table_scenes.scenes(seed)
    for _ in tqdm.trange(num_scenes, desc="recording demo episodes", unit="episode"):
        scene = next(scenes)
        for step in range(table_scenes.STEPS + 1):
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


def evaluate(policy: Any, num_scenes: int, seed: int = HELD_OUT_SEED) -> dict[str, Any]:
    """Subtask exact match and action MSE (robot space, the gripper's xy) over held-out scenes at their
    start, with fixed action noise per scene; `examples` keeps the first few sentences said."""
    horizon = policy.metadata["action_horizon"]
    noise_rng = np.random.default_rng(seed)
    matches, errors, examples = [], [], []
    scenes = table_scenes.scenes(seed)
    for _ in tqdm.trange(num_scenes, desc="held-out scenes", unit="scene"):
        scene = next(scenes)
        noise = noise_rng.standard_normal((horizon, policy.engine.config.action_dim)).astype(np.float32)
        out = policy.infer(scene.observation(0), noise=noise)
        truth = scene.action_chunk(0, horizon)
        errors.append(float(np.mean((np.asarray(out["actions"]) - truth) ** 2)))
        matches.append(out["text"] == scene.subtask)
        if len(examples) < 5:
            examples.append({"prompt": scene.prompt, "said": out["text"], "truth": scene.subtask})
    return {
        "scenes": num_scenes,
        "subtask_exact_match": float(np.mean(matches)),
        "action_mse": float(np.mean(errors)),
        "examples": examples,
    }


def eval_report(cfg: Any, checkpoint_dir: str | None, num_scenes: int) -> dict[str, Any]:
    """The trained model (`checkpoint_dir`, else the config's own) and the untrained one (the config's
    random init, with the trained model's norm stats) on the same held-out scenes."""
    from oxygen_jax import config
    from oxygen_jax.policies.policy import create_policy, norm_stats_for

    checkpoint_dir = config.checkpoint_for(cfg, checkpoint_dir)
    if checkpoint_dir is None:
        raise ValueError(f"config {cfg.name!r} names no checkpoint: pass --checkpoint_dir")
    kwargs = {"max_text_tokens": cfg.engine.max_new_tokens, "params_dtype": "float32"}
    trained = evaluate(create_policy(cfg, checkpoint_dir, **kwargs), num_scenes)
    untrained_cfg = cfg.copy_and_resolve_references()
    untrained_cfg.checkpoint_dir = ""
    stats = norm_stats_for(cfg, checkpoint_dir)
    untrained = evaluate(create_policy(untrained_cfg, None, norm_stats=stats, **kwargs), num_scenes)
    return {
        "config": cfg.name,
        "checkpoint_dir": str(checkpoint_dir),
        "held_out_seed": HELD_OUT_SEED,
        "trained": trained,
        "untrained": untrained,
        "action_mse_ratio": trained["action_mse"] / untrained["action_mse"],
    }
