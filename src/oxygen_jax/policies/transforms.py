"""Generic data transforms and the pi0.5 pipeline order shared by every robot.

A transform is a small frozen dataclass with `__call__(data) -> data` over one unbatched example (a dict of
numpy arrays). Transforms return new dicts instead of editing the caller's, so an observation can be reused.
The order in `make_pipeline` is openpi's (`create_trained_policy` + `ModelTransformFactory` for pi0.5).
"""

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeAlias

import numpy as np

from oxygen_jax.errors import InvalidRequest
from oxygen_jax.policies import image_tools
from oxygen_jax.policies.normalization import NormStats, normalize, pad_to_dim, unnormalize

DataDict: TypeAlias = dict[str, Any]

# pi0.5 sees 224x224 images.
IMAGE_SIZE = 224


class Transform(Protocol):
    def __call__(self, data: DataDict) -> DataDict: ...


class PromptTokenizer(Protocol):
    def tokenize(self, prompt: str, state: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]: ...


@dataclasses.dataclass(frozen=True)
class Compose:
    """Applies `transforms` in order."""

    transforms: Sequence[Transform]

    def __call__(self, data: DataDict) -> DataDict:
        for transform in self.transforms:
            data = transform(data)
        return data


def compose(transforms: Sequence[Transform]) -> Compose:
    return Compose(tuple(transforms))


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """`inputs`: raw robot observation -> model inputs; `outputs`: {"state", "actions"} -> robot actions.

    `outputs` needs the model-input `state` next to the raw model `actions` (delta-action robots add it back).
    `data_inputs` is the robot part of `inputs` (repack + robot transforms, before normalization): norm
    stats are computed on its output, as openpi computes them.
    """

    inputs: Compose
    outputs: Compose
    data_inputs: Compose


@dataclasses.dataclass(frozen=True)
class RepackTransform:
    """Renames keys of dataset-shaped data; each leaf of `structure` is the '/'-joined path of an old key.

    Example: `{"images": {"cam_high": "observation.images.top"}, "state": "observation.state"}`.
    """

    structure: Mapping[str, Any]

    def __call__(self, data: DataDict) -> DataDict:
        return _repack(self.structure, _flatten(data))


def _repack(structure: Mapping[str, Any], flat: DataDict) -> DataDict:
    return {
        key: _repack(value, flat) if isinstance(value, Mapping) else flat[value]
        for key, value in structure.items()
    }


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> DataDict:
    flat = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{path}/"))
        else:
            flat[path] = value
    return flat


@dataclasses.dataclass(frozen=True)
class InjectDefaultPrompt:
    """Adds `prompt` when the observation carries none (robots that always do one task)."""

    prompt: str | None

    def __call__(self, data: DataDict) -> DataDict:
        if self.prompt is None or "prompt" in data:
            return data
        return {**data, "prompt": np.asarray(self.prompt)}


@dataclasses.dataclass(frozen=True)
class Normalize:
    """Normalizes every top-level key that has stats (usually `state`, and `actions` when present)."""

    norm_stats: Mapping[str, NormStats] | None
    use_quantiles: bool = False
    # Raise if a key with stats is missing from the data (off at inference: there are no actions).
    strict: bool = False

    def __call__(self, data: DataDict) -> DataDict:
        return _apply_stats(data, self.norm_stats, normalize, self.use_quantiles, self.strict)


@dataclasses.dataclass(frozen=True)
class Unnormalize:
    """Inverse of `Normalize`; by default every key with stats must be present, as in openpi."""

    norm_stats: Mapping[str, NormStats] | None
    use_quantiles: bool = False
    strict: bool = True

    def __call__(self, data: DataDict) -> DataDict:
        return _apply_stats(data, self.norm_stats, unnormalize, self.use_quantiles, self.strict)


def _apply_stats(
    data: DataDict,
    norm_stats: Mapping[str, NormStats] | None,
    fn: Callable[..., np.ndarray],
    use_quantiles: bool,
    strict: bool,
) -> DataDict:
    if norm_stats is None:
        return data
    if strict and (missing := [key for key in norm_stats if key not in data]):
        raise ValueError(f"Norm stats keys {missing} not found in the data (keys {sorted(data)}).")
    out = dict(data)
    for key, stats in norm_stats.items():
        if key in data:
            out[key] = fn(data[key], stats, use_quantiles=use_quantiles)
    return out


@dataclasses.dataclass(frozen=True)
class ResizeImages:
    """Resizes every camera in `image` with aspect-preserving zero padding (PIL bilinear, as openpi)."""

    height: int
    width: int

    def __call__(self, data: DataDict) -> DataDict:
        images = {
            name: image_tools.resize_with_pad(image, self.height, self.width)
            for name, image in data["image"].items()
        }
        return {**data, "image": images}


@dataclasses.dataclass(frozen=True)
class TokenizePrompt:
    """Replaces `prompt` with `tokenized_prompt` / `tokenized_prompt_mask`.

    With `discrete_state_input` (pi0.5) the normalized, not yet padded state is written into the prompt.
    """

    tokenizer: PromptTokenizer
    discrete_state_input: bool = False

    def __call__(self, data: DataDict) -> DataDict:
        data = dict(data)
        if (prompt := data.pop("prompt", None)) is None:
            raise InvalidRequest("Prompt is required")  # the robot sent none and its config has no default
        state = None
        if self.discrete_state_input and (state := data.get("state")) is None:
            raise ValueError("State is required when the state is part of the prompt.")
        if not isinstance(prompt, str):
            prompt = np.asarray(prompt).item()
        if isinstance(prompt, bytes):
            prompt = prompt.decode("utf-8")
        tokens, mask = self.tokenizer.tokenize(prompt, state)
        return {**data, "tokenized_prompt": tokens, "tokenized_prompt_mask": mask}


@dataclasses.dataclass(frozen=True)
class PadStatesAndActions:
    """Zero-pads `state` (and `actions` when present) to the model's action dim."""

    model_action_dim: int

    def __call__(self, data: DataDict) -> DataDict:
        out = {**data, "state": pad_to_dim(np.asarray(data["state"]), self.model_action_dim)}
        if "actions" in data:
            out["actions"] = pad_to_dim(np.asarray(data["actions"]), self.model_action_dim)
        return out


def make_bool_mask(*dims: int) -> tuple[bool, ...]:
    """Run-length mask: positive n -> n Trues, negative n -> |n| Falses; `(6, -1)` -> 6 joints, 1 gripper."""
    return tuple(flag for dim in dims for flag in [dim > 0] * abs(dim))


def _shift_actions(data: DataDict, mask: Sequence[bool] | None, sign: float) -> DataDict:
    """`actions[..., :len(mask)] += sign * state` on the masked dims at every step, in the actions' dtype."""
    if "actions" not in data or mask is None:
        return data
    mask = np.asarray(mask)
    dims = mask.shape[-1]
    offset = np.expand_dims(np.where(mask, np.asarray(data["state"])[..., :dims], 0), axis=-2)
    actions = np.array(data["actions"])
    actions[..., :dims] += sign * offset
    return {**data, "actions": actions}


@dataclasses.dataclass(frozen=True)
class DeltaActions:
    """Absolute -> delta actions relative to the current state on the masked dims (training data only)."""

    mask: Sequence[bool] | None

    def __call__(self, data: DataDict) -> DataDict:
        return _shift_actions(data, self.mask, -1.0)


@dataclasses.dataclass(frozen=True)
class AbsoluteActions:
    """Delta -> absolute actions: adds the (unnormalized) state back on the masked dims."""

    mask: Sequence[bool] | None

    def __call__(self, data: DataDict) -> DataDict:
        return _shift_actions(data, self.mask, 1.0)


def make_pipeline(
    robot_inputs: Sequence[Transform],
    robot_outputs: Sequence[Transform],
    *,
    norm_stats: Mapping[str, NormStats] | None,
    tokenizer: PromptTokenizer,
    action_dim: int,
    discrete_state_input: bool,
    use_quantiles: bool = True,
    default_prompt: str | None = None,
    repack: Sequence[Transform] = (),
) -> Pipeline:
    """openpi's order. Inputs: repack, robot inputs, Normalize, InjectDefaultPrompt, ResizeImages(224),
    TokenizePrompt, PadStatesAndActions. Outputs: Unnormalize, robot outputs.

    pi0.5 normalizes with quantiles; z-score (`use_quantiles=False`) is pi0's.
    """
    inputs = [
        *repack,
        *robot_inputs,
        Normalize(norm_stats, use_quantiles=use_quantiles),
        InjectDefaultPrompt(default_prompt),
        ResizeImages(IMAGE_SIZE, IMAGE_SIZE),
        TokenizePrompt(tokenizer, discrete_state_input=discrete_state_input),
        PadStatesAndActions(action_dim),
    ]
    outputs = [Unnormalize(norm_stats, use_quantiles=use_quantiles), *robot_outputs]
    data_inputs = compose([*repack, *robot_inputs])
    return Pipeline(inputs=compose(inputs), outputs=compose(outputs), data_inputs=data_inputs)
