"""LIBERO (Franka, one arm): agent-view and wrist cameras, 8-d state, 7-d actions (6 EEF deltas + gripper)."""

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from oxygen_jax.policies import transforms as _transforms
from oxygen_jax.policies.image_tools import parse_image
from oxygen_jax.policies.normalization import NormStats
from oxygen_jax.policies.robot_io import RawSpec

ACTION_DIM = 7
# What a LIBERO client sends (openpi's examples/libero): flat keys that contain '/'.
RAW_SPEC = RawSpec(
    cameras={("observation/image",): True, ("observation/wrist_image",): True},
    vectors={("observation/state",): 8},
)


@dataclasses.dataclass(frozen=True)
class LiberoInputs:
    """LIBERO observation -> model cameras; the missing right wrist is a black, masked-out image."""

    def __call__(self, data: _transforms.DataDict) -> _transforms.DataDict:
        base_image = parse_image(data["observation/image"])
        wrist_image = parse_image(data["observation/wrist_image"])
        inputs = {
            "state": data["observation/state"],
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
        # Actions only exist in training data; LIBERO's are already deltas.
        for key in ("actions", "prompt"):
            if key in data:
                inputs[key] = data[key]
        return inputs


@dataclasses.dataclass(frozen=True)
class LiberoOutputs:
    """Drops the model's padding dims."""

    def __call__(self, data: _transforms.DataDict) -> _transforms.DataDict:
        return {"actions": np.asarray(data["actions"][..., :ACTION_DIM])}


def make_libero_pipeline(
    norm_stats: Mapping[str, NormStats] | None,
    tokenizer: _transforms.PromptTokenizer,
    *,
    action_dim: int = 32,
    discrete_state_input: bool = False,
    default_prompt: str | None = None,
    repack: Sequence[_transforms.Transform] = (),
) -> _transforms.Pipeline:
    """pi05_libero: quantile norm; the released checkpoint keeps the state out of the prompt."""
    return _transforms.make_pipeline(
        [LiberoInputs()],
        [LiberoOutputs()],
        norm_stats=norm_stats,
        tokenizer=tokenizer,
        action_dim=action_dim,
        discrete_state_input=discrete_state_input,
        default_prompt=default_prompt,
        repack=repack,
    )
