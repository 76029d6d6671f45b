"""Configs shipped with the package, found by name (`--config=pi05_libero`); see oxygen_jax.config."""
