"""The flat-key robots (LIBERO, DROID, the demo table) as rows of one transform: cameras to image slots,
masked slots black, state parts concatenated, actions cut to the robot's dims."""

import numpy as np

from oxygen_jax.policies import droid, libero, table


def _image(value: int) -> np.ndarray:
    return np.full((4, 6, 3), value, np.uint8)


def test_droid_state_joins_joints_and_a_scalar_gripper():
    out = droid.DroidInputs()(
        {
            "observation/exterior_image_1_left": _image(10),
            "observation/wrist_image_left": _image(20),
            "observation/joint_position": np.arange(7.0),
            "observation/gripper_position": 0.5,
            "prompt": "pick",
        }
    )
    np.testing.assert_array_equal(out["state"], [0, 1, 2, 3, 4, 5, 6, 0.5])
    assert out["image"]["base_0_rgb"][0, 0, 0] == 10 and out["image"]["left_wrist_0_rgb"][0, 0, 0] == 20
    np.testing.assert_array_equal(out["image"]["right_wrist_0_rgb"], np.zeros((4, 6, 3), np.uint8))
    assert [bool(m) for m in out["image_mask"].values()] == [True, True, False]
    assert out["prompt"] == "pick" and "actions" not in out


def test_table_fills_only_its_camera():
    out = table.TableInputs()({"observation/image": _image(7), "observation/state": np.array([0.1, 0.2])})
    assert list(out["image"]) == ["base_0_rgb"] and bool(out["image_mask"]["base_0_rgb"])
    np.testing.assert_allclose(out["state"], [0.1, 0.2])


def test_outputs_keep_the_robot_dims_and_raw_specs_name_its_keys():
    actions = np.arange(2 * 32.0).reshape(2, 32)
    assert libero.LiberoOutputs()({"actions": actions})["actions"].shape == (2, 7)
    assert droid.DroidOutputs()({"actions": actions})["actions"].shape == (2, 8)
    assert libero.RAW_SPEC.vectors == {("observation/state",): 8}
    assert set(droid.RAW_SPEC.cameras) == {
        ("observation/exterior_image_1_left",),
        ("observation/wrist_image_left",),
    }
