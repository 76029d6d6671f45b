"""openpi checkpoints restore unchanged, and tree mismatches are reported in full."""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from conftest import GOLDEN
from flax import traverse_util

from oxygen_jax.checkpoints import (
    CheckpointMismatchError,
    norm_stats_path,
    resolve_checkpoint_dir,
    restore_params,
    save_params,
)

CHECKPOINT = GOLDEN / "checkpoint"
LIBERO = "physical-intelligence/libero"
Q_EINSUM = ("PaliGemma", "llm", "layers", "attn", "q_einsum", "w")

pytestmark = [
    # Raw orbax restores below take the sharding from the checkpoint's file, which orbax warns about.
    pytest.mark.filterwarnings("ignore:Sharding info not provided"),
]


def _flat(tree: dict) -> dict[str, np.ndarray]:
    return {"/".join(k): np.asarray(v) for k, v in traverse_util.flatten_dict(tree).items()}


def _assert_bit_exact(got: dict, want: dict) -> None:
    got, want = _flat(got), _flat(want)
    assert got.keys() == want.keys()
    for path, value in want.items():
        assert got[path].dtype == value.dtype, path
        assert got[path].shape == value.shape, path
        assert got[path].tobytes() == value.tobytes(), path


@pytest.fixture(scope="module")
def golden_params() -> dict:
    return restore_params(CHECKPOINT)


def _mutated_checkpoint(tmp_path: pathlib.Path, params: dict, edit) -> pathlib.Path:
    flat = traverse_util.flatten_dict(params)
    edit(flat)
    save_params(tmp_path, traverse_util.unflatten_dict(flat))
    return tmp_path


def test_golden_tree_matches_param_tree_json(golden_params):
    listed = json.loads((GOLDEN / "param_tree.json").read_text())["params"]
    got = {p: (list(v.shape), str(v.dtype)) for p, v in _flat(golden_params).items()}
    assert got == {e["path"]: (e["shape"], e["dtype"]) for e in listed}
    assert all(isinstance(v, np.ndarray) for v in jax.tree.leaves(golden_params))


def test_golden_values_match_raw_orbax(golden_params):
    raw = ocp.PyTreeCheckpointer().restore(CHECKPOINT / "params")["params"]
    _assert_bit_exact(golden_params, raw)


def test_save_restore_round_trip(tmp_path, golden_params):
    params_dir = save_params(tmp_path, golden_params)
    assert params_dir == tmp_path.resolve() / "params"
    assert (params_dir / "manifest.ocdbt").is_file()
    value_types = {
        entry["value_metadata"]["value_type"]
        for entry in json.loads((params_dir / "_METADATA").read_text())["tree_metadata"].values()
    }
    assert value_types == {"jax.Array"}  # as in official checkpoints
    # The layout openpi reads: a PyTreeCheckpointer tree with a single "params" entry.
    assert list(ocp.PyTreeCheckpointer().restore(params_dir)) == ["params"]
    _assert_bit_exact(restore_params(tmp_path), golden_params)


def test_expected_tree_accepted(golden_params):
    expected = jax.eval_shape(lambda: golden_params)
    _assert_bit_exact(restore_params(CHECKPOINT, expected=expected), golden_params)


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda flat: flat.pop(Q_EINSUM), "missing: PaliGemma/llm/layers/attn/q_einsum/w"),
        (lambda flat: flat.update({("extra", "w"): np.zeros(3, np.float32)}), "unexpected: extra/w"),
        (
            lambda flat: flat.update({Q_EINSUM: np.zeros((4, 8, 64, 8), np.float32)}),
            "mis-shaped: PaliGemma/llm/layers/attn/q_einsum/w: "
            "checkpoint (4, 8, 64, 8) vs expected (4, 8, 64, 16)",
        ),
    ],
    ids=["missing", "unexpected", "misshaped"],
)
def test_mismatch_names_the_path(tmp_path, golden_params, edit, needle):
    ckpt = _mutated_checkpoint(tmp_path, golden_params, edit)
    with pytest.raises(CheckpointMismatchError) as info:
        restore_params(ckpt, expected=jax.eval_shape(lambda: golden_params))
    assert needle in str(info.value)
    assert isinstance(info.value, ValueError)


def test_mismatch_names_every_path(tmp_path, golden_params):
    def edit(flat):
        flat.pop(("action_in_proj", "bias"))
        flat.pop(("time_mlp_in", "kernel"))
        flat[("extra", "a")] = np.zeros(1, np.float32)
        flat[("extra", "b")] = np.zeros(1, np.float32)
        flat[("action_out_proj", "bias")] = np.zeros(5, np.float32)

    ckpt = _mutated_checkpoint(tmp_path, golden_params, edit)
    with pytest.raises(CheckpointMismatchError) as info:
        restore_params(ckpt, expected=jax.eval_shape(lambda: golden_params))
    err = info.value
    assert err.missing == ["action_in_proj/bias", "time_mlp_in/kernel"]
    assert err.unexpected == ["extra/a", "extra/b"]
    assert len(err.misshaped) == 1
    assert err.misshaped[0].startswith("action_out_proj/bias: checkpoint (5,) vs expected (32,)")
    for line in err.missing + err.unexpected + err.misshaped:
        assert line in str(err)


def test_nnx_value_level_is_stripped(tmp_path):
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(4, np.float32)
    save_params(tmp_path, {"x": {"w": {"value": a}}, "y": {"value": b}})
    expected = {
        "x": {"w": jax.ShapeDtypeStruct((2, 3), jnp.float32)},
        "y": jax.ShapeDtypeStruct((4,), jnp.float32),
    }
    _assert_bit_exact(restore_params(tmp_path, expected=expected), {"x": {"w": a}, "y": b})


def test_bfloat16_cast(golden_params):
    cast = restore_params(CHECKPOINT, dtype=jnp.bfloat16)
    want = jax.tree.map(lambda x: x.astype(jnp.bfloat16), golden_params)
    _assert_bit_exact(cast, want)


def test_release_and_params_dir_layouts():
    assert resolve_checkpoint_dir(CHECKPOINT) == CHECKPOINT.resolve()
    assert resolve_checkpoint_dir(str(CHECKPOINT / "params")) == CHECKPOINT.resolve()


def test_bare_params_dir_under_another_name(tmp_path):
    save_params(tmp_path, {"w": np.ones(2, np.float32)})
    renamed = (tmp_path / "params").rename(tmp_path / "weights")
    assert resolve_checkpoint_dir(renamed) == renamed.resolve()
    _assert_bit_exact(restore_params(renamed), {"w": np.ones(2, np.float32)})


def test_training_run_picks_highest_step(tmp_path):
    run = tmp_path / "run"
    for step in (100, 2000):
        save_params(run / str(step), {"step": np.full(1, step, np.int32)})
    (run / "2000.orbax-checkpoint-tmp-7").mkdir()  # an interrupted save must not win
    (run / "3000").mkdir()  # a step dir without params must not win
    assert resolve_checkpoint_dir(run) == (run / "2000").resolve()
    assert resolve_checkpoint_dir(run / "100") == (run / "100").resolve()
    assert restore_params(run)["step"].tolist() == [2000]


def test_openpi_cache_name(tmp_path, monkeypatch):
    cached = tmp_path / "cache" / "openpi-assets" / "checkpoints" / "pi05_libero"
    save_params(cached, {"w": np.ones(2, np.float32)})
    monkeypatch.setenv("OPENPI_DATA_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    assert resolve_checkpoint_dir("pi05_libero") == cached.resolve()
    assert resolve_checkpoint_dir("gs://openpi-assets/checkpoints/pi05_libero") == cached.resolve()


def test_missing_checkpoint_error_names_places_and_source(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENPI_DATA_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as info:
        resolve_checkpoint_dir("pi05_nope")
    message = str(info.value)
    assert str(tmp_path / "pi05_nope") in message
    assert str(tmp_path / "cache" / "openpi-assets" / "checkpoints" / "pi05_nope") in message
    assert "gs://openpi-assets/checkpoints/pi05_nope" in message


def test_existing_dir_without_params_is_reported(tmp_path):
    with pytest.raises(FileNotFoundError, match="exists but holds no params"):
        resolve_checkpoint_dir(tmp_path)


def test_norm_stats_path():
    path = norm_stats_path(CHECKPOINT, LIBERO)
    assert path == CHECKPOINT.resolve() / "assets" / LIBERO / "norm_stats.json"
    with pytest.raises(FileNotFoundError, match=f"asset ids present: \\['{LIBERO}'\\]"):
        norm_stats_path(CHECKPOINT, "physical-intelligence/droid")
