"""The tiny pi0.5 of the golden parity data: dummy Gemma experts, SigLIP mu/14, vocab 1024."""

from oxygen_jax import config


def get_config():
    c = config.base_config()
    c.name = "pi05_tiny"
    c.model.paligemma = config.gemma_variant("dummy")
    c.model.action_expert = config.gemma_variant("dummy")
    c.model.vision = "mu/14"
    c.model.vocab_size = 1024
    c.model.action_horizon = 10
    c.model.max_token_len = 48
    c.model.dtype = "float32"
    c.tokenizer_path = "standin"
    c.robot = "libero"
    c.asset_id = "physical-intelligence/libero"
    return c
