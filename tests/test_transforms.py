"""Robot transforms, normalization and image resizing against openpi's outputs (golden transforms_cases)."""

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import GOLDEN

from oxygen_jax.policies import aloha, droid, image_tools, libero, normalization, transforms
from oxygen_jax.tokenizer import Tokenizer

CASES = json.loads((GOLDEN / "transforms_cases.json").read_text())
PIPELINE_CASES = [name for name, case in CASES.items() if "raw_input" in case]
# Float pipeline outputs (state, actions) may differ from openpi by float rounding only.
FLOAT_ATOL = 1e-6


@functools.cache
def _npz() -> Any:
    return np.load(GOLDEN / "transforms_cases.npz")


@functools.cache
def _tokenizer() -> Tokenizer:
    return Tokenizer(GOLDEN / "tokenizer" / "tiny_paligemma_standin.model", max_len=48)


@functools.cache
def _norm_stats(robot: str) -> dict[str, normalization.NormStats]:
    stats = json.loads((GOLDEN / "transforms_norm_stats.json").read_text())
    return normalization.norm_stats_from_dict(stats[robot])


def _value(entry: dict[str, Any]) -> Any:
    """A golden leaf: a string, an inline array, or an array stored in the npz."""
    if entry.get("type") == "str":
        return entry["value"]
    if "npz_key" in entry:
        return _npz()[entry["npz_key"]]
    return np.asarray(entry["value"], dtype=entry["dtype"])


def _raw_observation(case: dict[str, Any]) -> dict[str, Any]:
    """Golden raw inputs are flat; ALOHA's `images/<cam>` is a nested dict, LIBERO/DROID keys contain '/'."""
    obs: dict[str, Any] = {}
    for key, entry in case["raw_input"].items():
        if key.startswith("images/"):
            obs.setdefault("images", {})[key.removeprefix("images/")] = _value(entry)
        else:
            obs[key] = _value(entry)
    return obs


def _flatten(data: dict[str, Any]) -> dict[str, Any]:
    return {
        f"{key}/{sub}" if isinstance(value, dict) else key: sub_value
        for key, value in data.items()
        for sub, sub_value in (value.items() if isinstance(value, dict) else [(None, value)])
    }


def _assert_matches(actual: Any, expected: np.ndarray, name: str) -> None:
    actual = np.asarray(actual)
    assert actual.shape == expected.shape, name
    if np.issubdtype(expected.dtype, np.floating):
        np.testing.assert_allclose(actual, expected, rtol=0, atol=FLOAT_ATOL, err_msg=name)
    else:
        assert actual.dtype.kind == expected.dtype.kind, name
        np.testing.assert_array_equal(actual, expected, err_msg=name)


def _pipeline(name: str) -> transforms.Pipeline:
    case = CASES[name]
    robot = name.split("_", maxsplit=1)[0]
    kwargs = {
        "tokenizer": _tokenizer(),
        "action_dim": 32,
        "discrete_state_input": case["discrete_state_input"],
    }
    assert case["use_quantiles"]
    if robot == "libero":
        return libero.make_libero_pipeline(_norm_stats(robot), **kwargs)
    if robot == "droid":
        return droid.make_droid_pipeline(_norm_stats(robot), **kwargs)
    return aloha.make_aloha_pipeline(
        _norm_stats(robot),
        adapt_to_pi="adapt1" in name,
        use_delta_joint_actions="delta" in name,
        **kwargs,
    )


@pytest.mark.parametrize("name", PIPELINE_CASES)
def test_pipeline_order_matches_openpi(name: str) -> None:
    pipeline = _pipeline(name)
    assert [type(t).__name__ for t in pipeline.inputs.transforms] == CASES[name]["input_transforms"]
    assert [type(t).__name__ for t in pipeline.outputs.transforms] == CASES[name]["output_transforms"]


@pytest.mark.parametrize("name", PIPELINE_CASES)
def test_input_pipeline_matches_openpi(name: str) -> None:
    model_input = _flatten(_pipeline(name).inputs(_raw_observation(CASES[name])))
    expected = CASES[name]["model_input"]
    assert sorted(model_input) == sorted(expected)
    for key, entry in expected.items():
        _assert_matches(model_input[key], _value(entry), f"{name}: {key}")


@pytest.mark.parametrize("name", PIPELINE_CASES)
def test_output_pipeline_matches_openpi(name: str) -> None:
    case = CASES[name]
    # The output pipeline sees the model-input state next to the raw model actions (openpi's Policy.infer).
    state = _value(case["model_input"]["state"])
    outputs = _pipeline(name).outputs({"state": state, "actions": _value(case["raw_model_actions"][""])})
    assert list(outputs) == ["actions"]
    _assert_matches(outputs["actions"], _value(case["robot_actions"][""]), name)


def test_input_pipeline_leaves_the_observation_untouched() -> None:
    obs = _raw_observation(CASES["aloha_pi05_adapt1_delta"])
    before = {key: np.copy(value) for key, value in _flatten(obs).items() if not isinstance(value, str)}
    _pipeline("aloha_pi05_adapt1_delta").inputs(obs)
    for key, value in before.items():
        np.testing.assert_array_equal(_flatten(obs)[key], value, err_msg=key)


@pytest.mark.parametrize("use_quantiles", [False, True], ids=["zscore", "quantile"])
@pytest.mark.parametrize(
    ("golden", "key", "width"),
    [("state", "state", 8), ("state_first5", "state", 5), ("actions7", "actions", 7)],
)
def test_normalize_matches_openpi_exactly(use_quantiles: bool, golden: str, key: str, width: int) -> None:
    kind = "quantile" if use_quantiles else "zscore"
    x = _npz()["norm/in/state" if key == "state" else "norm/in/actions32"][..., :width]
    actual = normalization.normalize(x, _norm_stats("libero")[key], use_quantiles=use_quantiles)
    expected = _npz()[f"norm/normalize_{kind}/{golden}"]
    assert actual.dtype == expected.dtype
    np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("use_quantiles", [False, True], ids=["zscore", "quantile"])
def test_unnormalize_padded_actions_matches_openpi_exactly(use_quantiles: bool) -> None:
    kind = "quantile" if use_quantiles else "zscore"
    x = _npz()["norm/in/actions32"]
    actual = normalization.unnormalize(x, _norm_stats("libero")["actions"], use_quantiles=use_quantiles)
    expected = _npz()[f"norm/unnormalize_{kind}/actions32"]
    assert actual.dtype == expected.dtype
    np.testing.assert_array_equal(actual, expected)


def test_norm_stats_round_trip_through_openpi_json(tmp_path: Path) -> None:
    checkpoint_assets = GOLDEN / "checkpoint" / "assets" / "physical-intelligence" / "libero"
    loaded = normalization.load_norm_stats(checkpoint_assets)
    saved = normalization.save_norm_stats(tmp_path, loaded)
    assert saved == tmp_path / "norm_stats.json"
    assert json.loads(saved.read_text()) == json.loads((checkpoint_assets / "norm_stats.json").read_text())
    reloaded = normalization.load_norm_stats(saved)
    for key, stats in _norm_stats("libero").items():
        np.testing.assert_array_equal(reloaded[key].q01, stats.q01)
        np.testing.assert_array_equal(reloaded[key].q99, stats.q99)


def test_resize_with_pad_matches_openpi_pil() -> None:
    case = CASES["resize_with_pad_pil"]
    actual = image_tools.resize_with_pad(_npz()[case["in"]], 224, 224)
    _assert_matches(actual, _npz()[case["out"]], "resize")


def test_resize_with_pad_keeps_batch_dims_and_float_images() -> None:
    image = _npz()[CASES["resize_with_pad_pil"]["in"]]
    batch = image_tools.resize_with_pad(np.stack([image, image[::-1]]), 224, 224)
    assert batch.shape == (2, 224, 224, 3)
    np.testing.assert_array_equal(batch[1], image_tools.resize_with_pad(image[::-1], 224, 224))
    as_float = image_tools.resize_with_pad(image.astype(np.float32), 224, 224)
    assert as_float.dtype == np.float32
    # Float resampling is exact where uint8 resampling rounds: within one grey level.
    np.testing.assert_allclose(as_float, batch[0], atol=1.0)


@pytest.mark.parametrize(
    ("fn", "atol"),
    [
        # arcsin is not correctly rounded: numpy builds may differ in the last bit.
        (aloha.gripper_to_angular, 1e-15),
        (aloha.gripper_from_angular, 0.0),
        (aloha.gripper_from_angular_inv, 0.0),
    ],
)
def test_aloha_gripper_conversions_match_openpi(fn, atol: float) -> None:
    expected = _npz()[f"aloha/{fn.__name__}"]
    np.testing.assert_allclose(fn(_npz()["aloha/gripper_grid"]), expected, rtol=0, atol=atol)


def test_repack_maps_dataset_keys_to_robot_keys() -> None:
    repack = transforms.RepackTransform(
        {"images": {"cam_high": "observation.images.top"}, "state": "obs/state"}
    )
    data = {"observation.images.top": 1, "obs": {"state": 2}, "unused": 3}
    assert repack(data) == {"images": {"cam_high": 1}, "state": 2}


def test_delta_then_absolute_actions_is_identity() -> None:
    mask = aloha.DELTA_ACTION_MASK
    rng = np.random.default_rng(0)
    data = {"state": rng.normal(size=14), "actions": rng.normal(size=(10, 14))}
    delta = transforms.DeltaActions(mask)(data)
    np.testing.assert_array_equal(delta["actions"][:, 6], data["actions"][:, 6])
    np.testing.assert_allclose(delta["actions"][:, 0], data["actions"][:, 0] - data["state"][0])
    np.testing.assert_allclose(transforms.AbsoluteActions(mask)(delta)["actions"], data["actions"])
