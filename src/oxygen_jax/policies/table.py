"""The demo table robot: one top-down camera, a 2-d gripper position, 2-d actions (gripper waypoints).

It is the robot of `pi05_demo`, whose scenes `oxygen_jax.evaluation.table_scenes` renders, so the demo
model can be trained, served and checked without a simulator.
"""

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from oxygen_jax.policies import transforms as _transforms
from oxygen_jax.policies.image_tools import parse_image
from oxygen_jax.policies.normalization import NormStats
from oxygen_jax.policies.robot_io import RawSpec

ACTION_DIM = 2
RAW_SPEC = RawSpec(cameras={("observation/image",): True}, vectors={("observation/state",): 2})


@dataclasses.dataclass(frozen=True)
class TableInputs:
    """Table observation -> the model's one camera (`base_0_rgb`)."""

    def __call__(self, data: _transforms.DataDict) -> _transforms.DataDict:
        inputs = {
            "state": np.asarray(data["observation/state"]),
            "image": {"base_0_rgb": parse_image(data["observation/image"])},
            "image_mask": {"base_0_rgb": np.True_},
        }
        for key in ("actions", "prompt"):
            if key in data:
                inputs[key] = data[key]
        return inputs


@dataclasses.dataclass(frozen=True)
class TableOutputs:
    """Drops the model's padding dims."""

    def __call__(self, data: _transforms.DataDict) -> _transforms.DataDict:
        return {"actions": np.asarray(data["actions"][..., :ACTION_DIM])}


def make_table_pipeline(
    norm_stats: Mapping[str, NormStats] | None,
    tokenizer: _transforms.PromptTokenizer,
    *,
    action_dim: int = 32,
    discrete_state_input: bool = False,
    default_prompt: str | None = None,
    repack: Sequence[_transforms.Transform] = (),
) -> _transforms.Pipeline:
    """Quantile norm, as every pi0.5 robot."""
    return _transforms.make_pipeline(
        [TableInputs()],
        [TableOutputs()],
        norm_stats=norm_stats,
        tokenizer=tokenizer,
        action_dim=action_dim,
        discrete_state_input=discrete_state_input,
        default_prompt=default_prompt,
        repack=repack,
    )
