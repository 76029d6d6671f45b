"""Moved to `oxygen_jax.lerobot.writer`; this name keeps existing imports working for one release."""

import warnings

from oxygen_jax.lerobot.writer import *  # noqa: F403

warnings.warn(
    "oxygen_jax.training.data.lerobot_writer moved to oxygen_jax.lerobot.writer",
    DeprecationWarning,
    stacklevel=2,
)
