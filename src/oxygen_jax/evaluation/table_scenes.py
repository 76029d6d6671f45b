"""Moved to `oxygen_jax.table_task.scenes`; this name keeps existing imports working for one release."""

import warnings

from oxygen_jax.table_task.scenes import *  # noqa: F403

warnings.warn(
    "oxygen_jax.evaluation.table_scenes moved to oxygen_jax.table_task.scenes",
    DeprecationWarning,
    stacklevel=2,
)
