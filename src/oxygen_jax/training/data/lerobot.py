"""Moved to `oxygen_jax.lerobot.reader`; this name keeps existing imports working for one release."""

import warnings

from oxygen_jax.lerobot.reader import *  # noqa: F403

warnings.warn(
    "oxygen_jax.training.data.lerobot moved to oxygen_jax.lerobot.reader", DeprecationWarning, stacklevel=2
)
