"""Robots whose clients send flat keys (LIBERO, DROID, the demo table): each camera fills one of the
model's image slots, slots without a camera get a black, masked-out image, and the state is the state
parts concatenated. A robot is one `FlatRobot` row; its own file names the transforms as openpi does
(`LiberoInputs`, `DroidOutputs`, ...)."""

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from oxygen_jax.policies import transforms
from oxygen_jax.policies.image_tools import parse_image
from oxygen_jax.policies.normalization import NormStats
from oxygen_jax.policies.robot_io import RawSpec


@dataclasses.dataclass(frozen=True)
class FlatRobot:
    """cameras: (raw key, model image slot) pairs, the first the base camera; masked_slots: model slots
    that get a black image; state: (raw key, size) parts concatenated in order; action_dim: robot dims."""

    cameras: tuple[tuple[str, str], ...]
    masked_slots: tuple[str, ...]
    state: tuple[tuple[str, int], ...]
    action_dim: int

    @property
    def raw_spec(self) -> RawSpec:
        return RawSpec(
            cameras={(key,): True for key, _ in self.cameras},
            vectors={(key,): size for key, size in self.state},
        )


@dataclasses.dataclass(frozen=True)
class FlatInputs:
    """Raw observation -> model images, image masks and state (actions and prompt pass through)."""

    robot: FlatRobot

    def __call__(self, data: transforms.DataDict) -> transforms.DataDict:
        # A 1-value part (DROID's gripper) may arrive as a scalar; every part must be 1-d to concatenate.
        state = np.concatenate([np.atleast_1d(np.asarray(data[key])) for key, _ in self.robot.state])
        images = {slot: parse_image(data[key]) for key, slot in self.robot.cameras}
        base = next(iter(images.values()))
        masks = {slot: np.True_ for slot in images}
        for slot in self.robot.masked_slots:
            images[slot] = np.zeros_like(base)
            masks[slot] = np.False_
        inputs = {"state": state, "image": images, "image_mask": masks}
        # Actions only exist in training data.
        if "actions" in data:
            inputs["actions"] = np.asarray(data["actions"])
        if "prompt" in data:
            inputs["prompt"] = data["prompt"]
        return inputs


@dataclasses.dataclass(frozen=True)
class FlatOutputs:
    """Drops the model's padding dims."""

    robot: FlatRobot

    def __call__(self, data: transforms.DataDict) -> transforms.DataDict:
        return {"actions": np.asarray(data["actions"][..., : self.robot.action_dim])}


def make_pipeline(
    robot_inputs: FlatInputs,
    robot_outputs: FlatOutputs,
    norm_stats: Mapping[str, NormStats] | None,
    tokenizer: transforms.PromptTokenizer,
    *,
    action_dim: int = 32,
    discrete_state_input: bool = True,
    default_prompt: str | None = None,
    repack: Sequence[transforms.Transform] = (),
) -> transforms.Pipeline:
    """openpi's pi0.5 pipeline (quantile norm) around the robot's own transforms."""
    return transforms.make_pipeline(
        [robot_inputs],
        [robot_outputs],
        norm_stats=norm_stats,
        tokenizer=tokenizer,
        action_dim=action_dim,
        discrete_state_input=discrete_state_input,
        default_prompt=default_prompt,
        repack=repack,
    )
