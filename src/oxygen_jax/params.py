"""Model params for a config: restored from an openpi checkpoint, or random when there is none."""

import logging

import jax
import jax.numpy as jnp

from oxygen_jax import checkpoints
from oxygen_jax.models import pi05

logger = logging.getLogger(__name__)

PARAMS_DTYPES = ("bfloat16", "float32")


def load_params(
    model_config: pi05.Pi05Config, checkpoint_dir: str | None, *, seed: int = 0, dtype: str | None = None
) -> dict:
    """Params checked against the model's tree and cast to `dtype` (None: as stored / float32 init).

    A checkpoint comes in openpi's tree; a random init (no checkpoint) comes in the engine's per-layer
    layout (`pi05.runtime_layout`), so the full model never holds its layers twice.

    openpi's `create_trained_policy` restores as bfloat16; pass dtype="bfloat16" to replicate it (the
    engine then casts to its compute dtype).
    """
    if dtype is not None and dtype not in PARAMS_DTYPES:
        raise ValueError(f"params dtype must be one of {PARAMS_DTYPES} or None, got {dtype!r}")
    cast = None if dtype is None else jnp.dtype(dtype)
    if checkpoint_dir is None:
        logger.warning(
            "no checkpoint: random-initialized model (seed %d); its actions and text are meaningless", seed
        )
        return pi05.init_params(model_config, jax.random.key(seed), stacked=False, dtype=dtype or "float32")
    params = checkpoints.restore_params(checkpoint_dir, expected=pi05.param_shapes(model_config), dtype=cast)
    logger.info("restored params from %s (%s)", checkpoint_dir, dtype or "as stored")
    return params
