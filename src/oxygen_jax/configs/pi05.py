"""Full-size pi0.5: Gemma 2B backbone + Gemma 300M action expert + SigLIP So400m/14."""

from oxygen_jax import config


def get_config():
    return config.base_config()
