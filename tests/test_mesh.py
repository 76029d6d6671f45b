"""Sharding over a device mesh: parsing, and sharded results equal to single-device ones.

The parity tests run tests/sharded_run.py in a subprocess that sees 4 forced host devices (JAX reads
XLA_FLAGS at import). It runs the golden tiny model unsharded and on the mesh, with the same noise.
"""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from conftest import FORCED_DEVICES

from oxygen_jax.engine import mesh
from oxygen_jax.runtime.manager import bucket

RUNNER = pathlib.Path(__file__).with_name("sharded_run.py")


@pytest.mark.parametrize(
    "spec, sizes",
    [
        ("data:4", {"data": 4, "model": 1}),
        ("data:2,model:2", {"data": 2, "model": 2}),
        ("model:2", {"data": 1, "model": 2}),
    ],
)
def test_mesh_spec_names_axis_sizes(spec, sizes):
    assert mesh.parse_mesh(spec, num_devices=4) == sizes


def test_mesh_asking_more_devices_than_visible_is_refused():
    with pytest.raises(mesh.MeshError, match=r"needs 8 devices, but 4 are visible"):
        mesh.parse_mesh("data:4,model:2", num_devices=4)


@pytest.mark.parametrize("spec", ["data=4", "data:0", "gpu:2", "data:2,data:2", "data:two", ""])
def test_malformed_mesh_is_refused_in_one_line(spec):
    with pytest.raises(mesh.MeshError) as error:
        mesh.parse_mesh(spec, num_devices=4)
    assert "\n" not in str(error.value)


def test_batch_sizes_the_data_axis_does_not_divide_are_refused():
    mesh.check_divides(4, max_slots=8, max_prefill_batch=4)
    with pytest.raises(mesh.MeshError, match=r"max_slots=6 is not a multiple of the mesh's data axis \(4\)"):
        mesh.check_divides(4, max_slots=6)


def test_buckets_are_multiples_of_the_data_axis():
    assert [bucket(n, 8, 4) for n in range(1, 9)] == [4, 4, 4, 4, 8, 8, 8, 8]
    assert [bucket(n, 8) for n in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]


def test_both_experts_shard_heads_and_mlp_and_other_params_replicate():
    assert mesh.param_logical_axes("PaliGemma/llm/layers_0/attn/q_einsum_1/w", 3) == (
        "embed",
        "heads",
        "head_dim",
    )
    assert mesh.param_logical_axes("PaliGemma/llm/layers_0/mlp/linear", 2) == ("mlp", "embed")
    vision_block = "PaliGemma/img/Transformer/encoderblock_0"
    assert mesh.param_logical_axes(f"{vision_block}/MlpBlock_0/Dense_0/kernel", 2) == ("embed", "mlp")
    assert mesh.param_logical_axes(f"{vision_block}/MultiHeadDotProductAttention_0/qkv/kernel", 4) == (
        "embed",
        None,
        "heads",
        "head_dim",
    )
    assert mesh.param_logical_axes("time_mlp_out/kernel", 2) == (None, None)


MESHES = ["data:4", "data:2,model:2"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, np.ndarray]:
    """Every output of the single-device run ("single/...") and of each mesh ("<mesh>/...")."""
    out = tmp_path_factory.mktemp("mesh") / "results.npz"
    env = os.environ | FORCED_DEVICES | {"PYTHONPATH": os.pathsep.join([str(RUNNER.parent), *sys.path])}
    subprocess.run([sys.executable, str(RUNNER), str(out), *MESHES], env=env, check=True, timeout=900)
    results = np.load(out)
    return {k: results[k] for k in results.files}


@pytest.fixture(params=MESHES)
def sharded(request, runs) -> tuple[str, dict[str, np.ndarray]]:
    """(mesh, results) with the mesh's outputs under "mesh/..." beside "single/..."."""
    prefix = request.param + "/"
    mesh_results = {"mesh/" + k.removeprefix(prefix): v for k, v in runs.items() if k.startswith(prefix)}
    return request.param, {k: v for k, v in runs.items() if k.startswith("single/")} | mesh_results


@pytest.mark.integration
def test_sharded_actions_equal_single_device_actions(sharded):
    _, r = sharded
    scale = np.abs(r["single/actions"]).max()
    np.testing.assert_allclose(r["mesh/actions"], r["single/actions"], rtol=0, atol=1e-5 * scale)


@pytest.mark.integration
def test_sharded_guided_actions_equal_single_device_guided_actions(sharded):
    """Real-time chunking on a mesh (3 guided rows with different settings, 1 plain row): the guided program
    partitioned over the rows and heads gives the single-device guided actions; guidance really acted."""
    _, r = sharded
    guided = r["single/guided_actions"]
    np.testing.assert_allclose(r["mesh/guided_actions"], guided, rtol=0, atol=1e-5 * np.abs(guided).max())
    moved = np.abs(guided - r["single/actions"]).max(axis=(1, 2))
    assert (moved[[0, 2, 3]] > 1e-2).all() and moved[1] < 1e-5


@pytest.mark.integration
def test_sharded_greedy_text_equals_single_device_text(sharded):
    _, r = sharded
    np.testing.assert_array_equal(r["mesh/text"], r["single/text"])
    np.testing.assert_array_equal(r["mesh/state_tokens"], r["single/state_tokens"])
    np.testing.assert_allclose(r["mesh/text_logprobs"], r["single/text_logprobs"], rtol=0, atol=1e-5)


@pytest.mark.integration
def test_sharded_sampled_text_equals_single_device_text(sharded):
    """Temperature 1 with the same seeds: any difference in the distribution would show."""
    _, r = sharded
    np.testing.assert_array_equal(r["mesh/sampled_text"], r["single/sampled_text"])


@pytest.mark.integration
def test_sharded_prefix_keys_are_close_to_single_device_keys(sharded):
    """K goes through RoPE, whose angles XLA may round differently once partitioned: close, not equal."""
    _, r = sharded
    scale = np.abs(r["single/k"]).max()
    np.testing.assert_allclose(r["mesh/k"], r["single/k"], rtol=0, atol=1e-4 * scale)


@pytest.mark.integration
def test_batch_state_slots_lie_on_the_data_axis(sharded):
    _, r = sharded
    assert str(r["mesh/state_k_spec"]) == "('data',)"
    assert str(r["mesh/state_tokens_spec"]) == "('data',)"
    assert str(r["mesh/state_keys_spec"]) == "('data',)"
    assert str(r["mesh/cache_k_spec"]).startswith("(None, 'data'")


@pytest.mark.integration
def test_model_axis_splits_attention_heads(sharded):
    """Both meshes name the model axis (size 1 under data:4, where it splits nothing)."""
    _, r = sharded
    assert str(r["mesh/q_spec"]) == "(None, 'model', None)"


@pytest.mark.integration
def test_served_frames_on_a_mesh_equal_single_device_and_never_compile(sharded):
    """3 frames of robots 0-2 (each frame's actions and text are the engine's on those rows)."""
    _, r = sharded
    actions, text = r["single/actions"][:3], r["single/text"][:3]
    scale = np.abs(actions).max()
    for frame_actions in r["mesh/served_actions"]:
        np.testing.assert_allclose(frame_actions, actions, rtol=0, atol=1e-5 * scale)
    np.testing.assert_array_equal(r["mesh/served_text"], np.concatenate([text] * 3))
    assert int(r["mesh/served_compiles"]) == 0


@pytest.mark.integration
def test_language_slots_spread_evenly_over_the_data_axis(sharded):
    spec, r = sharded
    data = mesh.parse_mesh(spec, num_devices=4)["data"]
    loads = r["mesh/admitted_loads"]
    assert loads.shape == (3, data)
    assert loads.sum(axis=1).tolist() == [1, 3, 4]
    assert (loads.max(axis=1) - loads.min(axis=1) <= 1).all()
