"""The vision tower's runtime layout (per-layer encoder blocks, query/key/value fused, cameras batched into
one encoder call) against openpi's scanned encoder run one camera at a time, as the model ran it before."""

import dataclasses

import jax
import numpy as np
import pytest

from oxygen_jax.models import pi05, siglip

VISION_DEPTH = 3  # the tiny model's SigLIP has one layer; three make the per-layer trees a loop
CONTROL_FLOW = ("stablehlo.while", "stablehlo.case", "stablehlo.if")


@pytest.fixture(scope="module")
def deep_config(tiny_config):
    return dataclasses.replace(
        tiny_config, vision=dataclasses.replace(tiny_config.vision, depth=VISION_DEPTH)
    )


@pytest.fixture(scope="module")
def stacked(deep_config):
    """openpi's tree with random weights; the head (zero-initialized) drawn too, so tokens are not zero."""
    params = pi05.init_params(deep_config, jax.random.key(7))
    head = params["PaliGemma"]["img"]["head"]
    head["kernel"] = 0.1 * jax.random.normal(jax.random.key(8), head["kernel"].shape)
    return params


def _leaves(tree) -> dict[str, tuple[tuple[int, ...], str]]:
    return {
        jax.tree_util.keystr(path, simple=True, separator="/"): (tuple(x.shape), str(x.dtype))
        for path, x in jax.tree_util.tree_leaves_with_path(tree)
    }


def test_runtime_layout_of_a_stacked_init_is_the_unstacked_init(deep_config):
    converted = jax.eval_shape(lambda: pi05.runtime_layout(pi05.init_params(deep_config, jax.random.key(0))))
    direct = pi05.param_shapes(deep_config, stacked=False)
    assert _leaves(converted) == _leaves(direct)
    encoder = _leaves(direct["PaliGemma"]["img"]["Transformer"])
    v = deep_config.vision
    for i in range(VISION_DEPTH):
        attention = f"encoderblock_{i}/MultiHeadDotProductAttention_0"
        assert encoder[f"{attention}/qkv/kernel"][0] == (v.width, 3, v.num_heads, v.width // v.num_heads)
        assert encoder[f"{attention}/qkv/bias"][0] == (3, v.num_heads, v.width // v.num_heads)
    assert not any(path.startswith("encoderblock/") for path in encoder)


def test_runtime_encoder_holds_each_layer_of_the_stack(stacked):
    stack = stacked["PaliGemma"]["img"]["Transformer"]["encoderblock"]
    runtime = siglip.runtime_encoder(stacked["PaliGemma"]["img"]["Transformer"])
    for i in range(VISION_DEPTH):
        block = runtime[f"encoderblock_{i}"]
        fused = block["MultiHeadDotProductAttention_0"]["qkv"]
        for j, name in enumerate(("query", "key", "value")):
            np.testing.assert_array_equal(
                fused["kernel"][:, j], stack["MultiHeadDotProductAttention_0"][name]["kernel"][i]
            )
            np.testing.assert_array_equal(
                fused["bias"][j], stack["MultiHeadDotProductAttention_0"][name]["bias"][i]
            )
        np.testing.assert_array_equal(
            block["MlpBlock_0"]["Dense_1"]["kernel"], stack["MlpBlock_0"]["Dense_1"]["kernel"][i]
        )
    assert siglip.runtime_encoder(runtime) is runtime


@pytest.mark.parametrize("skip_cameras", [(), ("left_wrist_0_rgb",)])
def test_batched_runtime_cameras_give_the_scanned_per_camera_tokens(
    deep_config, stacked, golden_obs, skip_cameras
):
    """Matched: the image tokens of `embed_prefix` in the runtime layout (all cameras in one encoder call)
    against openpi's scanned encoder applied to each camera alone, concatenated in config order; the whole
    input mask exactly. Tolerance: float32 rounding, atol 1e-5 (about 40 ulp at the largest tokens, ~2.4;
    seen here: 1e-6): the fused projection computes the same dot products, only a larger matmul may sum
    them in another order, and three layers carry that on."""
    runtime_config = dataclasses.replace(deep_config, scan_layers=False)
    tokens, mask, _ = jax.jit(pi05.embed_prefix, static_argnums=(1, 3))(
        pi05.runtime_layout(stacked), runtime_config, golden_obs, skip_cameras
    )
    encoder = siglip.Siglip(deep_config.vision, deep_config.paligemma.width, deep_config.dtype)
    cameras = [key for key in deep_config.image_keys if key not in skip_cameras]
    per_camera = [
        jax.jit(encoder.apply)({"params": stacked["PaliGemma"]["img"]}, golden_obs.images[key])
        for key in cameras
    ]
    expected = np.concatenate(per_camera, axis=1)
    assert np.abs(expected).max() > 0.1
    np.testing.assert_allclose(tokens[:, : expected.shape[1]], expected, rtol=0, atol=1e-5)
    image_masks = [
        np.repeat(golden_obs.image_masks[key][:, None], deep_config.image_tokens, 1) for key in cameras
    ]
    np.testing.assert_array_equal(
        mask, np.concatenate([*image_masks, golden_obs.tokenized_prompt_mask], axis=1)
    )


def _vision_program(config: pi05.Pi05Config, golden_obs) -> str:
    """The image part of `embed_prefix` as StableHLO lowered for CUDA (traced on shapes: nothing runs)."""
    params = pi05.param_shapes(config, stacked=config.scan_layers)
    traced = jax.jit(pi05.embed_images, static_argnums=(1, 3)).trace(
        params, config, golden_obs, config.image_keys
    )
    return traced.lower(lowering_platforms=("cuda",)).as_text()


def test_runtime_vision_program_has_no_control_flow(deep_config, golden_obs):
    """Every encoder layer is straight-line code in the runtime layout; the scanned layout is one loop."""
    runtime = _vision_program(dataclasses.replace(deep_config, scan_layers=False), golden_obs)
    assert not [op for op in CONTROL_FLOW if op in runtime]
    assert (
        runtime.count("stablehlo.dot_general") >= VISION_DEPTH * 5
    )  # qkv, 2 attention, out, 2 mlp per layer
    assert "stablehlo.while" in _vision_program(deep_config, golden_obs)
