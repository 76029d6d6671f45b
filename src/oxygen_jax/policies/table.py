"""The demo table robot: one top-down camera, a 2-d gripper position, 2-d actions (gripper waypoints).

It is the robot of `pi05_demo`, whose scenes `oxygen_jax.table_task.scenes` renders, so the demo
model can be trained, served and checked without a simulator.
"""

import dataclasses
import functools

from oxygen_jax.policies import flat_robot

ROBOT = flat_robot.FlatRobot(
    cameras=(("observation/image", "base_0_rgb"),),
    masked_slots=(),
    state=(("observation/state", 2),),
    action_dim=2,
)
RAW_SPEC = ROBOT.raw_spec
ACTION_DIM = ROBOT.action_dim


@dataclasses.dataclass(frozen=True)
class TableInputs(flat_robot.FlatInputs):
    robot: flat_robot.FlatRobot = ROBOT


@dataclasses.dataclass(frozen=True)
class TableOutputs(flat_robot.FlatOutputs):
    robot: flat_robot.FlatRobot = ROBOT


make_table_pipeline = functools.partial(
    flat_robot.make_pipeline, TableInputs(), TableOutputs(), discrete_state_input=False
)
