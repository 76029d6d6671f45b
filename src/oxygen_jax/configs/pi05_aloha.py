"""pi0.5 for ALOHA: action horizon 50 (openpi's pi05_aloha)."""

from oxygen_jax import config


def get_config():
    c = config.base_config()
    c.name = "pi05_aloha"
    c.model.action_horizon = 50
    c.robot = "aloha"
    c.asset_id = "trossen"
    return c
