"""A config's dataset as train examples and norm stats (its `data` section names the columns)."""

from collections.abc import Mapping

from oxygen_jax import config
from oxygen_jax.errors import ConfigError
from oxygen_jax.lerobot.reader import LeRobotDataset
from oxygen_jax.policies.normalization import NormStats
from oxygen_jax.policies.policy import robot, robot_pipeline
from oxygen_jax.training.data.examples import Columns, FrameSource, TrainExamples
from oxygen_jax.training.data.norm_stats import compute_norm_stats


def columns(cfg) -> Columns:
    """`cfg.data.repack` ("raw_key=column" pairs), `cfg.data.actions`, and `cfg.data.subtask` and
    `cfg.data.min_clean_prefix` (or None)."""
    if not cfg.data.repack:
        raise ConfigError(
            f"config {cfg.name!r} names no dataset columns: set data.repack ('raw_key=column' pairs) and "
            "data.actions to train on a dataset"
        )
    if cfg.data.min_clean_prefix is not None and not cfg.model.max_clean_prefix:
        raise ConfigError(
            f"config {cfg.name!r} sets data.min_clean_prefix but trains no clean prefix "
            "(model.max_clean_prefix = 0): the actions it names would be taught; set model.max_clean_prefix"
        )
    pairs = [entry.split("=", 1) for entry in cfg.data.repack]
    if any(len(pair) != 2 for pair in pairs):
        raise ValueError(f"config data.repack entries must be 'raw_key=column', got {list(cfg.data.repack)}")
    return Columns(
        repack=dict(pairs),
        actions=cfg.data.actions,
        subtask=cfg.data.subtask,
        min_clean_prefix=cfg.data.min_clean_prefix,
    )


def train_examples(cfg, dataset_dir: str, norm_stats: Mapping[str, NormStats] | None) -> TrainExamples:
    """Examples of the LeRobot dataset at `dataset_dir` through the config's robot transforms."""
    model_config = config.model_config(cfg)
    source = FrameSource(
        LeRobotDataset(dataset_dir),
        columns(cfg),
        model_config.action_horizon,
        keep_decoded=cfg.data.keep_decoded,
    )
    tokenizer = config.build_tokenizer(cfg)
    pipeline = robot_pipeline(cfg, norm_stats, tokenizer)
    return TrainExamples(source, pipeline, tokenizer, model_config, robot(cfg).raw_spec)


def dataset_norm_stats(cfg, dataset_dir: str) -> dict[str, NormStats]:
    """openpi-style norm stats (`state`, `actions`) of the dataset after the robot transforms."""
    examples = train_examples(cfg, dataset_dir, None)
    frames = (examples.robot_data(i) for i in range(len(examples)))
    return compute_norm_stats(frames, total=len(examples))
