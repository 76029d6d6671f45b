"""pi0.5 for the ALOHA sim (gym-aloha): openpi's ALOHA sim data, absolute joints, prompt "Transfer cube"."""

from oxygen_jax import config


def get_config():
    c = config.base_config()
    c.name = "pi05_aloha_sim"
    c.model.action_horizon = 50
    c.robot = "aloha_sim"
    # openpi's asset id for its ALOHA sim data (the LeRobot repo id).
    c.asset_id = "lerobot/aloha_sim_transfer_cube_human"
    return c
