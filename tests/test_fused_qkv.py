"""The engine's fused attention weights (`pi05.fused_layout`, `qkv_einsum` [D, N + 2K, H] per expert and
layer, one projection for q, k and v) hold openpi's q/kv weights and compute the same model."""

import dataclasses

import jax
import numpy as np
import pytest

from oxygen_jax.engine import kernels
from oxygen_jax.models import pi05


def _leaves(tree) -> dict:
    return {jax.tree_util.keystr(path): x.shape for path, x in jax.tree_util.tree_leaves_with_path(tree)}


@pytest.fixture(scope="module")
def stacked(tiny_config):
    return pi05.init_params(tiny_config, jax.random.key(3))


def test_fused_layout_holds_openpis_q_and_kv(tiny_config, stacked):
    fused = pi05.fused_layout(pi05.runtime_layout(stacked))
    layers = stacked["PaliGemma"]["llm"]["layers"]["attn"]
    for i in range(tiny_config.paligemma.depth):
        attn = fused["PaliGemma"]["llm"][f"layers_{i}"]["attn"]
        assert sorted(attn) == ["attn_vec_einsum", "attn_vec_einsum_1", "qkv_einsum", "qkv_einsum_1"]
        for suffix, expert in (("", tiny_config.paligemma), ("_1", tiny_config.action_expert)):
            w = np.asarray(attn[f"qkv_einsum{suffix}"]["w"])
            heads, kv_heads = expert.num_heads, expert.num_kv_heads
            assert w.shape == (expert.width, heads + 2 * kv_heads, expert.head_dim)
            q, kv = layers[f"q_einsum{suffix}"]["w"][i], layers[f"kv_einsum{suffix}"]["w"][i]
            np.testing.assert_array_equal(w[:, :heads], q.transpose(1, 0, 2))
            np.testing.assert_array_equal(w[:, heads : heads + kv_heads], kv[0].transpose(1, 0, 2))
            np.testing.assert_array_equal(w[:, heads + kv_heads :], kv[1].transpose(1, 0, 2))


def test_fused_module_initializes_the_fused_layout(tiny_config, stacked):
    config = dataclasses.replace(tiny_config, fused_qkv=True)
    direct = pi05.param_shapes(config, stacked=False)
    assert _leaves(direct) == _leaves(pi05.fused_layout(pi05.runtime_layout(stacked)))


def test_fused_and_separate_projections_compute_the_same_model(golden_params, tiny_config, golden_obs):
    """Prefill and plain denoising on CPU float32, to float32 rounding: each output column of the fused
    matmul is the same dot as in the separate ones, but the backend may tile the wider matmul differently
    and so sum in another order (on an AVX-512 CPU the two differ by up to 2e-6 in values of order 1)."""
    runtime = dataclasses.replace(tiny_config, scan_layers=False, kernels=kernels.for_backend())
    fused = dataclasses.replace(runtime, fused_qkv=True)
    separate_params = pi05.runtime_layout(golden_params)
    fused_params = pi05.fused_layout(separate_params)
    prefill = jax.jit(pi05.prefill, static_argnums=1)
    denoise = jax.jit(pi05.denoise, static_argnames=("config", "num_steps"))
    noise = np.random.default_rng(0).standard_normal(
        (2, runtime.action_horizon, runtime.action_dim), np.float32
    )
    want_cache = prefill(separate_params, runtime, golden_obs)
    got_cache = prefill(fused_params, fused, golden_obs)
    for a, b in zip(jax.tree.leaves(got_cache), jax.tree.leaves(want_cache), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    np.testing.assert_allclose(
        denoise(params=fused_params, config=fused, cache=got_cache, noise=noise, num_steps=3),
        denoise(params=separate_params, config=runtime, cache=want_cache, noise=noise, num_steps=3),
        rtol=0,
        atol=1e-5,
    )
