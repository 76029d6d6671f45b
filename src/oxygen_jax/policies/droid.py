"""DROID (Franka, one arm): exterior and wrist cameras, 7 joints + gripper state, 8-d actions."""

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from oxygen_jax.policies import transforms as _transforms
from oxygen_jax.policies.image_tools import parse_image
from oxygen_jax.policies.normalization import NormStats
from oxygen_jax.policies.robot_io import RawSpec

ACTION_DIM = 8
# What a DROID client sends (openpi's examples/droid); the gripper position may be a scalar.
RAW_SPEC = RawSpec(
    cameras={("observation/exterior_image_1_left",): True, ("observation/wrist_image_left",): True},
    vectors={("observation/joint_position",): 7, ("observation/gripper_position",): 1},
)


@dataclasses.dataclass(frozen=True)
class DroidInputs:
    """DROID observation -> model cameras; state = joint positions + gripper, no right wrist camera."""

    def __call__(self, data: _transforms.DataDict) -> _transforms.DataDict:
        # The gripper may arrive as a scalar; it must be 1-d to concatenate.
        gripper = np.atleast_1d(np.asarray(data["observation/gripper_position"]))
        state = np.concatenate([data["observation/joint_position"], gripper])
        base_image = parse_image(data["observation/exterior_image_1_left"])
        wrist_image = parse_image(data["observation/wrist_image_left"])
        inputs = {
            "state": state,
            "image": {
                "base_0_rgb": base_image,
                "left_wrist_0_rgb": wrist_image,
                "right_wrist_0_rgb": np.zeros_like(base_image),
            },
            "image_mask": {
                "base_0_rgb": np.True_,
                "left_wrist_0_rgb": np.True_,
                "right_wrist_0_rgb": np.False_,
            },
        }
        if "actions" in data:
            inputs["actions"] = np.asarray(data["actions"])
        if "prompt" in data:
            inputs["prompt"] = data["prompt"]
        return inputs


@dataclasses.dataclass(frozen=True)
class DroidOutputs:
    """7 joint dims + gripper; drops the model's padding dims."""

    def __call__(self, data: _transforms.DataDict) -> _transforms.DataDict:
        return {"actions": np.asarray(data["actions"][..., :ACTION_DIM])}


def make_droid_pipeline(
    norm_stats: Mapping[str, NormStats] | None,
    tokenizer: _transforms.PromptTokenizer,
    *,
    action_dim: int = 32,
    discrete_state_input: bool = True,
    default_prompt: str | None = None,
    repack: Sequence[_transforms.Transform] = (),
) -> _transforms.Pipeline:
    """pi05_droid: quantile norm, state in the prompt (the pi0.5 default)."""
    return _transforms.make_pipeline(
        [DroidInputs()],
        [DroidOutputs()],
        norm_stats=norm_stats,
        tokenizer=tokenizer,
        action_dim=action_dim,
        discrete_state_input=discrete_state_input,
        default_prompt=default_prompt,
        repack=repack,
    )
