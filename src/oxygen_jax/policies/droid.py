"""DROID (Franka, one arm): exterior and wrist cameras, 7 joints + gripper state, 8-d actions."""

import dataclasses
import functools

from oxygen_jax.policies import flat_robot

# What a DROID client sends (openpi's examples/droid); the gripper position may be a scalar.
ROBOT = flat_robot.FlatRobot(
    cameras=(
        ("observation/exterior_image_1_left", "base_0_rgb"),
        ("observation/wrist_image_left", "left_wrist_0_rgb"),
    ),
    masked_slots=("right_wrist_0_rgb",),
    state=(("observation/joint_position", 7), ("observation/gripper_position", 1)),
    action_dim=8,
)
RAW_SPEC = ROBOT.raw_spec
ACTION_DIM = ROBOT.action_dim


@dataclasses.dataclass(frozen=True)
class DroidInputs(flat_robot.FlatInputs):
    robot: flat_robot.FlatRobot = ROBOT


@dataclasses.dataclass(frozen=True)
class DroidOutputs(flat_robot.FlatOutputs):
    robot: flat_robot.FlatRobot = ROBOT


# pi05_droid: state in the prompt (the pi0.5 default).
make_droid_pipeline = functools.partial(flat_robot.make_pipeline, DroidInputs(), DroidOutputs())
