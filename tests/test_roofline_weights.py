"""The roofline's weight split, against counts computed by hand from the full-size `pi05` config's
dimensions, in each param layout the model has (openpi's stacked tree, the runtime layout, the engine's
fused q/k/v). The floors of every phase derive from this split."""

import jax
import jax.numpy as jnp
import pytest

from oxygen_jax import config as config_lib
from oxygen_jax.benchmarks import roofline
from oxygen_jax.models import pi05


def _layer(g) -> int:
    """One Gemma layer's matmul weights: q, k and v, the output projection and the GeGLU MLP."""
    return (
        g.width * (g.num_heads + 2 * g.num_kv_heads) * g.head_dim
        + g.num_heads * g.head_dim * g.width
        + (3 * g.width * g.mlp_dim)
    )


def _expected(config: pi05.Pi05Config) -> dict[str, int]:
    g, e, v = config.paligemma, config.action_expert, config.vision
    patch = v.patch_size**2 * 3 * v.width
    vision_layer = 4 * v.width * v.width + 2 * v.width * v.mlp_dim
    return {
        "vision": patch + v.depth * vision_layer + v.width * g.width,
        "backbone": g.depth * _layer(g),
        "action_expert": e.depth * _layer(e) + 2 * config.action_dim * e.width,
        # Two adaRMS norms per layer and the final one (width -> 3 * width each), the time MLP's two layers.
        "conditioning": (2 * e.depth + 1) * e.width * 3 * e.width + 2 * e.width * e.width,
        "embedding": config.vocab_size * g.width,
    }


@pytest.fixture(scope="module")
def full_config() -> pi05.Pi05Config:
    return config_lib.model_config(config_lib.get_config("pi05"))


@pytest.mark.parametrize("layout", ["stacked", "runtime", "fused"])
def test_weight_split_matches_the_config(full_config, layout):
    shapes = pi05.param_shapes(full_config, stacked=layout == "stacked")
    if layout == "fused":
        shapes = jax.eval_shape(pi05.fused_layout, shapes)
    counts = roofline.weight_counts(shapes)
    assert counts == _expected(full_config)
    # The figures the floors rest on: about 1.98 B backbone, 0.31 B per flow step, 0.12 B conditioning.
    assert round(counts["backbone"] / 1e9, 2) == 1.98
    assert round(counts["action_expert"] / 1e9, 2) == 0.31
    assert round(counts["conditioning"] / 1e9, 2) == 0.12


def test_denoise_reads_conditioning_once_per_call(full_config):
    """Ten flow steps read the per-step weights ten times and the conditioning weights once."""
    weights = _expected(full_config)
    one = roofline.phase_costs(full_config, weights, 2, 1, (1,), 30, prompt_len=48)["denoise"][1]
    ten = roofline.phase_costs(full_config, weights, 2, 10, (1,), 30, prompt_len=48)["denoise"][1]
    item = jnp.dtype(full_config.dtype).itemsize
    assert ten - one == 9 * (one - weights["conditioning"] * item)
