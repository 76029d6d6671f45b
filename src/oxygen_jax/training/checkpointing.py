"""Training checkpoints in openpi's run layout, which inference loads unchanged.

    <run_dir>/<step>/params/                          {"params": serving params} (orbax PyTree), openpi's
                                                      inference item: the EMA params when tracked, LoRA merged
    <run_dir>/<step>/train_state/                     step, trainable and frozen params, optimizer state, EMA
    <run_dir>/<step>/assets/<asset_id>/norm_stats.json

`oxygen_jax.checkpoints.resolve_checkpoint_dir(run_dir)` (so `create_policy`, `infer.py`, `serve.py`)
picks the highest step, and openpi's `restore_params` reads `<step>/params` as it reads its own runs.
Steps are written by an orbax CheckpointManager (a scratch folder renamed into place once complete),
keeping the newest and every `keep_period`-th, as openpi's `initialize_checkpoint_dir`.
"""

import os
import pathlib
from collections.abc import Mapping

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import serialization

from oxygen_jax.policies.normalization import NormStats, save_norm_stats
from oxygen_jax.training.train_step import TrainSpec, TrainState, serving_params

PARAMS = "params"
TRAIN_STATE = "train_state"


def _manager(run_dir: str | os.PathLike[str], keep_period: int | None = None) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(
        max_to_keep=1, keep_period=keep_period or None, create=True, enable_async_checkpointing=False
    )
    return ocp.CheckpointManager(
        pathlib.Path(run_dir).resolve(), item_names=(PARAMS, TRAIN_STATE), options=options
    )


def latest_step(run_dir: str | os.PathLike[str]) -> int | None:
    """The newest complete step of a run, or None when it has none (or does not exist)."""
    if not pathlib.Path(run_dir).is_dir():
        return None
    manager = _manager(run_dir)
    try:
        return manager.latest_step()
    finally:
        manager.close()


def save_checkpoint(
    run_dir: str | os.PathLike[str],
    state: TrainState,
    spec: TrainSpec,
    *,
    norm_stats: Mapping[str, NormStats] | None = None,
    asset_id: str | None = None,
    keep_period: int | None = None,
) -> pathlib.Path:
    """Writes step `state.step` (params, train_state, norm stats); returns `<run_dir>/<step>`."""
    step = int(state.step)
    manager = _manager(run_dir, keep_period)
    try:
        manager.save(
            step,
            args=ocp.args.Composite(
                params=ocp.args.PyTreeSave({"params": serving_params(state, spec)}),
                train_state=ocp.args.PyTreeSave(serialization.to_state_dict(state)),
            ),
        )
        manager.wait_until_finished()
    finally:
        manager.close()
    step_dir = pathlib.Path(run_dir).resolve() / str(step)
    if norm_stats is not None:
        if not asset_id:
            raise ValueError("norm stats need an asset_id to be stored under (config asset_id)")
        save_norm_stats(step_dir / "assets" / asset_id, norm_stats)
    return step_dir


def restore_train_state(
    run_dir: str | os.PathLike[str], like: TrainState, step: int | None = None
) -> TrainState:
    """The train state of `step` (None: the newest) as host numpy arrays, in the structure of `like`
    (a state or its `jax.eval_shape`); placing it on devices is the caller's choice."""
    manager = _manager(run_dir)
    try:
        step = manager.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"{run_dir}: no training checkpoint to resume from")
        target = serialization.to_state_dict(like)
        restore_args = jax.tree.map(lambda _: ocp.ArrayRestoreArgs(restore_type=np.ndarray), target)
        restored = manager.restore(
            step,
            args=ocp.args.Composite(
                train_state=ocp.args.PyTreeRestore(item=target, restore_args=restore_args)
            ),
        )[TRAIN_STATE]
    finally:
        manager.close()
    return serialization.from_state_dict(like, restored)
