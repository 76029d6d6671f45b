"""pi0.5 numerics against upstream openpi (golden model_io.npz, tiny model, float32)."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import GOLDEN

from oxygen_jax import config
from oxygen_jax.engine.compile_counter import CompileCounter
from oxygen_jax.models import pi05

ATOL_HIDDEN = 2e-5  # prefix tokens, KV cache, hidden states, v_t (README tolerances)
ATOL_ACTIONS = 1e-4


def _leaves(tree) -> dict[str, tuple[tuple[int, ...], str]]:
    return {
        jax.tree_util.keystr(path, simple=True, separator="/"): (tuple(x.shape), str(x.dtype))
        for path, x in jax.tree_util.tree_leaves_with_path(tree)
    }


def _golden_tree(name: str) -> dict[str, tuple[tuple[int, ...], str]]:
    tree = json.loads((GOLDEN / name).read_text())
    return {p["path"]: (tuple(p["shape"]), p["dtype"]) for p in tree["params"]}


def test_tiny_param_tree_matches_openpi(tiny_config):
    assert _leaves(pi05.param_shapes(tiny_config)) == _golden_tree("param_tree.json")


@pytest.mark.integration
def test_runtime_layout_is_openpi_layout_per_layer_and_d_first(tiny_config):
    """The engine's runtime layout holds openpi's stacked tree: layer i's tree (`layers_i`) is the
    stacked tree at i, with the attention q/kv weights' D axis moved to the front; and it is the tree the
    unscanned module initializes."""
    stacked = pi05.init_params(tiny_config, jax.random.key(3))
    runtime = pi05.runtime_layout(stacked)
    direct = pi05.param_shapes(tiny_config, stacked=False)
    assert _leaves(runtime) == _leaves(direct)
    layers = stacked["PaliGemma"]["llm"]["layers"]
    for i in range(tiny_config.paligemma.depth):
        layer = runtime["PaliGemma"]["llm"][f"layers_{i}"]
        for suffix in ("", "_1"):
            q, kv = layers["attn"][f"q_einsum{suffix}"]["w"][i], layers["attn"][f"kv_einsum{suffix}"]["w"][i]
            np.testing.assert_array_equal(layer["attn"][f"q_einsum{suffix}"]["w"], q.transpose(1, 0, 2))
            np.testing.assert_array_equal(layer["attn"][f"kv_einsum{suffix}"]["w"], kv.transpose(2, 0, 1, 3))
        np.testing.assert_array_equal(layer["mlp"]["linear"], layers["mlp"]["linear"][i])


def test_full_param_tree_matches_openpi_without_allocating():
    full = config.model_config(config.load_config("pi05"))
    shapes = pi05.param_shapes(full)  # eval_shape: nothing is allocated
    assert _leaves(shapes) == _golden_tree("param_tree_full.json")
    leaves = jax.tree.leaves(shapes)
    assert len(leaves) == 51
    assert sum(math.prod(x.shape) for x in leaves) == 3_353_433_872


@pytest.fixture(scope="module")
def prefix(golden_params, tiny_config, golden_obs):
    return jax.jit(pi05.prefix_forward, static_argnums=1)(golden_params, tiny_config, golden_obs)


def test_prefix_embedding_masks_and_positions(golden_params, tiny_config, golden_obs, model_io, prefix):
    tokens, mask, ar_mask = jax.jit(pi05.embed_prefix, static_argnums=1)(
        golden_params, tiny_config, golden_obs
    )
    np.testing.assert_array_equal(mask, model_io["out/prefix_mask"])
    np.testing.assert_array_equal(ar_mask, model_io["out/prefix_ar_mask"])
    np.testing.assert_array_equal(pi05.make_attn_mask(mask, ar_mask), model_io["out/prefix_attn_mask"])
    np.testing.assert_allclose(tokens, model_io["out/prefix_tokens"], rtol=0, atol=ATOL_HIDDEN)
    cache, _ = prefix
    np.testing.assert_array_equal(cache.positions, model_io["out/prefix_positions"])
    np.testing.assert_array_equal(cache.length, model_io["out/prefix_mask"].sum(axis=1))


def test_prefix_kv_cache_and_hidden_states(model_io, prefix):
    cache, hidden = prefix
    np.testing.assert_allclose(cache.k, model_io["out/kv_cache_k"], rtol=0, atol=ATOL_HIDDEN)
    np.testing.assert_allclose(cache.v, model_io["out/kv_cache_v"], rtol=0, atol=ATOL_HIDDEN)
    valid = model_io["out/prefix_mask"]  # masked columns hold deterministic garbage in both
    np.testing.assert_allclose(
        np.asarray(hidden)[valid], model_io["out/prefix_out"][valid], rtol=0, atol=ATOL_HIDDEN
    )


def test_first_denoising_step(golden_params, tiny_config, model_io, prefix):
    cache, _ = prefix
    time = jnp.ones(2)
    _, cond = pi05.embed_suffix(golden_params, tiny_config, model_io["in/noise"], time)
    np.testing.assert_allclose(
        pi05.posemb_sincos(time, 64, 4e-3, 4.0), model_io["out/step0_time_posemb"], rtol=0, atol=1e-6
    )
    np.testing.assert_allclose(cond, model_io["out/step0_adarms_cond"], rtol=0, atol=1e-6)
    v_t = jax.jit(pi05.predict_velocity, static_argnums=1)(
        golden_params, tiny_config, cache, model_io["in/noise"], time
    )
    np.testing.assert_allclose(v_t, model_io["out/step0_v_t"], rtol=0, atol=ATOL_HIDDEN)


@pytest.mark.parametrize(("num_steps", "key"), [(1, "out/actions_1step"), (10, "out/actions")])
def test_sample_actions(golden_params, tiny_config, golden_obs, model_io, num_steps, key):
    sample = jax.jit(pi05.sample_actions, static_argnums=1)
    actions = sample(golden_params, tiny_config, golden_obs, model_io["in/noise"], num_steps)
    np.testing.assert_allclose(actions, model_io[key], rtol=1e-4, atol=ATOL_ACTIONS)
    highest = np.load(GOLDEN / "model_io_highest.npz")
    np.testing.assert_allclose(actions, highest[key], rtol=1e-4, atol=ATOL_ACTIONS)


def test_denoise_steps_are_traced_not_recompiled(golden_params, tiny_config, prefix, model_io):
    cache, _ = prefix
    denoise = jax.jit(pi05.denoise, static_argnums=1)
    denoise(golden_params, tiny_config, cache, model_io["in/noise"], 1)
    with CompileCounter() as counter:
        for steps in (5, 10):
            denoise(golden_params, tiny_config, cache, model_io["in/noise"], steps)
    assert counter.count == 0
