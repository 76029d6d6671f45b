"""The CPU benchmark model: small enough for a 2-core machine, shaped like pi0.5 (MQA, 3 cameras)."""

import ml_collections

from oxygen_jax import config


def get_config():
    c = config.base_config()
    c.name = "pi05_cpu"
    c.model.paligemma = ml_collections.ConfigDict(
        dict(width=256, depth=6, mlp_dim=2048, num_heads=8, num_kv_heads=1, head_dim=32)
    )
    c.model.action_expert = ml_collections.ConfigDict(
        dict(width=128, depth=6, mlp_dim=512, num_heads=8, num_kv_heads=1, head_dim=32)
    )
    c.model.vision = "Ti/14"
    c.model.vocab_size = 1024
    c.model.action_horizon = 10
    c.model.max_token_len = 100
    c.tokenizer_path = "standin"
    c.robot = "libero"
    c.asset_id = "physical-intelligence/libero"
    return c
