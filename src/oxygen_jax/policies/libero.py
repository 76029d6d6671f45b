"""LIBERO (Franka, one arm): agent-view and wrist cameras, 8-d state, 7-d actions (6 EEF deltas + gripper)."""

import dataclasses
import functools

from oxygen_jax.policies import flat_robot

# What a LIBERO client sends (openpi's examples/libero): flat keys that contain '/'.
ROBOT = flat_robot.FlatRobot(
    cameras=(("observation/image", "base_0_rgb"), ("observation/wrist_image", "left_wrist_0_rgb")),
    masked_slots=("right_wrist_0_rgb",),
    state=(("observation/state", 8),),
    action_dim=7,
)
RAW_SPEC = ROBOT.raw_spec
ACTION_DIM = ROBOT.action_dim


@dataclasses.dataclass(frozen=True)
class LiberoInputs(flat_robot.FlatInputs):
    robot: flat_robot.FlatRobot = ROBOT


@dataclasses.dataclass(frozen=True)
class LiberoOutputs(flat_robot.FlatOutputs):
    robot: flat_robot.FlatRobot = ROBOT


# pi05_libero: the released checkpoint keeps the state out of the prompt.
make_libero_pipeline = functools.partial(
    flat_robot.make_pipeline, LiberoInputs(), LiberoOutputs(), discrete_state_input=False
)
