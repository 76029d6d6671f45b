"""pi0.5 for DROID: action horizon 15 (openpi's pi05_droid)."""

from oxygen_jax import config


def get_config():
    c = config.base_config()
    c.name = "pi05_droid"
    c.model.action_horizon = 15
    c.robot = "droid"
    c.asset_id = "droid"
    return c
