"""Scoring a policy on the demo task's held-out scenes: the text it says against the true subtask, and its
action chunk against the true one."""

import pathlib
from typing import Any

import numpy as np
import tqdm

import oxygen_jax
from oxygen_jax import config
from oxygen_jax.policies.policy import create_policy, norm_stats_for
from oxygen_jax.table_task import scenes


def evaluate(policy: Any, num_scenes: int, seed: int = scenes.HELD_OUT_SEED) -> dict[str, Any]:
    """Subtask exact match and action MSE (robot space, the gripper's xy) over held-out scenes at their
    start, with fixed action noise per scene; `examples` keeps the first few sentences said."""
    horizon = policy.metadata["action_horizon"]
    noise_rng = np.random.default_rng(seed)
    matches, errors, examples = [], [], []
    stream = scenes.scenes(seed)
    for _ in tqdm.trange(num_scenes, desc="held-out scenes", unit="scene"):
        scene = next(stream)
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
    checkpoint_dir = config.checkpoint_for(cfg, checkpoint_dir)
    if checkpoint_dir is None:
        raise ValueError(f"config {cfg.name!r} names no checkpoint: pass --checkpoint_dir")
    kwargs = {"max_text_tokens": cfg.engine.max_new_tokens, "params_dtype": "float32"}
    trained = evaluate(create_policy(cfg, checkpoint_dir, **kwargs), num_scenes)
    untrained_cfg = cfg.copy_and_resolve_references()
    untrained_cfg.checkpoint_dir = None
    stats = norm_stats_for(cfg, checkpoint_dir)
    untrained = evaluate(create_policy(untrained_cfg, None, norm_stats=stats, **kwargs), num_scenes)
    return {
        "config": cfg.name,
        "checkpoint_dir": recorded_checkpoint(checkpoint_dir),
        "held_out_seed": scenes.HELD_OUT_SEED,
        "trained": trained,
        "untrained": untrained,
        "action_mse_ratio": trained["action_mse"] / untrained["action_mse"],
    }


def recorded_checkpoint(checkpoint_dir: str) -> str:
    """The checkpoint as a report names it: one shipped in the package relative to the package's folder
    (`oxygen_jax/assets/pi05_demo`), so the report reads the same on every machine; any other as given."""
    package = pathlib.Path(oxygen_jax.__file__).resolve().parent
    path = pathlib.Path(checkpoint_dir).expanduser()
    if path.is_dir() and path.resolve().is_relative_to(package):
        return path.resolve().relative_to(package.parent).as_posix()
    return checkpoint_dir
