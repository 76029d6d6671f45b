"""ALOHA (bimanual): up to four CHW cameras; 14-d state/actions `[left 6 joints, gripper, right 6, gripper]`.

pi0/pi0.5 were pretrained in the "pi internal" joint space: some joints are flipped and the grippers are
angular instead of ALOHA's linear positions. `adapt_to_pi` converts standard ALOHA data to and from it.
"""

import dataclasses
from collections.abc import Mapping, Sequence
from typing import ClassVar

import numpy as np

from oxygen_jax.policies import transforms as _transforms
from oxygen_jax.policies.image_tools import convert_to_uint8
from oxygen_jax.policies.normalization import NormStats
from oxygen_jax.policies.robot_io import RawSpec

ACTION_DIM = 14
# What an ALOHA client sends (openpi's examples/aloha_*): CHW cameras under `images`, cam_high required.
RAW_SPEC = RawSpec(
    cameras={
        ("images", "cam_high"): True,
        ("images", "cam_low"): False,
        ("images", "cam_left_wrist"): False,
        ("images", "cam_right_wrist"): False,
    },
    vectors={("state",): ACTION_DIM},
    channels_first_only=True,
)
GRIPPER_DIMS = [6, 13]
# Joints are deltas relative to the current state, grippers stay absolute.
DELTA_ACTION_MASK = _transforms.make_bool_mask(6, -1, 6, -1)
# Sign flips between ALOHA and pi joint conventions (integer, as openpi: it promotes float32 to float64).
JOINT_FLIP_MASK = np.array([1, -1, -1, 1, 1, 1, 1, 1, -1, -1, 1, 1, 1, 1])

# ALOHA puppet gripper: linear position range (PUPPET_GRIPPER_POSITION_OPEN/CLOSED) and joint range.
_GRIPPER_LINEAR_RANGE = (0.01844, 0.05800)
_GRIPPER_JOINT_RANGE = (-0.6213, 1.4910)
# Interbotix gripper linkage, used to turn a linear position back into an angle.
_ARM_LENGTH = 0.036
_HORN_RADIUS = 0.022
# pi gripper angle range (normalized 0..1 between encoder counts 2405 and 3110 of 4096, zero at 2048).
_PI_GRIPPER_RANGE = (0.5476, 1.6296)


def _to_unit(x: np.ndarray, low: float, high: float) -> np.ndarray:
    return (x - low) / (high - low)


def _from_unit(x: np.ndarray, low: float, high: float) -> np.ndarray:
    return x * (high - low) + low


def gripper_to_angular(value: np.ndarray) -> np.ndarray:
    """ALOHA's normalized linear gripper position -> pi's normalized angle (state inputs)."""
    linear = _from_unit(value, *_GRIPPER_LINEAR_RANGE)
    # Inverse of Interbotix's angle -> linear mapping.
    sine = (_HORN_RADIUS**2 + linear**2 - _ARM_LENGTH**2) / (2 * _HORN_RADIUS * linear)
    angle = np.arcsin(np.clip(sine, -1.0, 1.0))
    return _to_unit(angle, *_PI_GRIPPER_RANGE)


def gripper_from_angular(value: np.ndarray) -> np.ndarray:
    """pi gripper prediction -> ALOHA gripper joint, normalized to ALOHA's joint range (action outputs)."""
    return _to_unit(value + _PI_GRIPPER_RANGE[0], *_GRIPPER_JOINT_RANGE)


def gripper_from_angular_inv(value: np.ndarray) -> np.ndarray:
    """Exact inverse of `gripper_from_angular` (training actions)."""
    return _from_unit(value, *_GRIPPER_JOINT_RANGE) - _PI_GRIPPER_RANGE[0]


def _decode_state(state: np.ndarray, adapt_to_pi: bool) -> np.ndarray:
    if not adapt_to_pi:
        return state
    state = JOINT_FLIP_MASK * state
    state[..., GRIPPER_DIMS] = gripper_to_angular(state[..., GRIPPER_DIMS])
    return state


def _encode_actions(actions: np.ndarray, adapt_to_pi: bool) -> np.ndarray:
    if not adapt_to_pi:
        return actions
    actions = JOINT_FLIP_MASK * actions
    actions[..., GRIPPER_DIMS] = gripper_from_angular(actions[..., GRIPPER_DIMS])
    return actions


def _encode_actions_inv(actions: np.ndarray, adapt_to_pi: bool) -> np.ndarray:
    if not adapt_to_pi:
        return actions
    actions = JOINT_FLIP_MASK * actions
    actions[..., GRIPPER_DIMS] = gripper_from_angular_inv(actions[..., GRIPPER_DIMS])
    return actions


@dataclasses.dataclass(frozen=True)
class AlohaInputs:
    """ALOHA observation -> model inputs. `cam_high` is required; a missing wrist camera becomes a black,
    masked-out image; `cam_low` is accepted but pi0.5 has no slot for it."""

    adapt_to_pi: bool = True

    EXPECTED_CAMERAS: ClassVar[tuple[str, ...]] = ("cam_high", "cam_low", "cam_left_wrist", "cam_right_wrist")
    WRIST_CAMERAS: ClassVar[dict[str, str]] = {
        "left_wrist_0_rgb": "cam_left_wrist",
        "right_wrist_0_rgb": "cam_right_wrist",
    }

    def __call__(self, data: _transforms.DataDict) -> _transforms.DataDict:
        in_images = data["images"]
        if set(in_images) - set(self.EXPECTED_CAMERAS):
            raise ValueError(f"Expected images to contain {self.EXPECTED_CAMERAS}, got {tuple(in_images)}")
        # CHW (float in [0, 1] or uint8) -> HWC uint8.
        in_images = {name: np.moveaxis(convert_to_uint8(image), 0, -1) for name, image in in_images.items()}

        base_image = in_images["cam_high"]
        images = {"base_0_rgb": base_image}
        image_masks = {"base_0_rgb": np.True_}
        for dest, source in self.WRIST_CAMERAS.items():
            images[dest] = in_images.get(source, np.zeros_like(base_image))
            image_masks[dest] = np.bool_(source in in_images)

        inputs = {
            "image": images,
            "image_mask": image_masks,
            "state": _decode_state(np.asarray(data["state"]), self.adapt_to_pi),
        }
        if "actions" in data:
            inputs["actions"] = _encode_actions_inv(np.asarray(data["actions"]), self.adapt_to_pi)
        if "prompt" in data:
            inputs["prompt"] = data["prompt"]
        return inputs


@dataclasses.dataclass(frozen=True)
class AlohaOutputs:
    """First 14 dims, converted back to ALOHA's joint space."""

    adapt_to_pi: bool = True

    def __call__(self, data: _transforms.DataDict) -> _transforms.DataDict:
        actions = np.asarray(data["actions"][..., :ACTION_DIM])
        return {"actions": _encode_actions(actions, self.adapt_to_pi)}


def make_aloha_pipeline(
    norm_stats: Mapping[str, NormStats] | None,
    tokenizer: _transforms.PromptTokenizer,
    *,
    action_dim: int = 32,
    discrete_state_input: bool = True,
    adapt_to_pi: bool = True,
    use_delta_joint_actions: bool = True,
    default_prompt: str | None = None,
    repack: Sequence[_transforms.Transform] = (),
) -> _transforms.Pipeline:
    """pi05_aloha: quantile norm, state in the prompt, delta joint actions (state added back on output).

    The output pipeline needs `state` (the model-input state) next to `actions`.
    """
    inputs: list[_transforms.Transform] = [AlohaInputs(adapt_to_pi=adapt_to_pi)]
    outputs: list[_transforms.Transform] = [AlohaOutputs(adapt_to_pi=adapt_to_pi)]
    if use_delta_joint_actions:
        inputs.append(_transforms.DeltaActions(DELTA_ACTION_MASK))
        outputs.insert(0, _transforms.AbsoluteActions(DELTA_ACTION_MASK))
    return _transforms.make_pipeline(
        inputs,
        outputs,
        norm_stats=norm_stats,
        tokenizer=tokenizer,
        action_dim=action_dim,
        discrete_state_input=discrete_state_input,
        default_prompt=default_prompt,
        repack=repack,
    )
