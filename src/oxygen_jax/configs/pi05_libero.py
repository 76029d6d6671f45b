"""pi0.5 for LIBERO: action horizon 10, state not in the prompt (openpi's pi05_libero)."""

from oxygen_jax import config


def get_config():
    c = config.base_config()
    c.name = "pi05_libero"
    c.model.action_horizon = 10
    c.model.discrete_state_input = False
    c.robot = "libero"
    c.asset_id = "physical-intelligence/libero"
    return c
