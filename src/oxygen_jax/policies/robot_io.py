"""One robot's raw observation in, the model's canonical inputs out, checked one request at a time.

Everything a served robot sends passes through `RobotIO.inputs` on its own before it meets any other
request, so no request can change how another one is batched or computed:

- Only the keys the robot's transforms read (its `RawSpec`) are taken from the observation; anything else
  (an `actions` key, extra cameras, metadata) is ignored and never reaches the model batch.
- Each of those keys is checked by name: images are uint8, or floats in [0, 1], with 3 channels (HWC or
  CHW as the robot allows); state vectors are finite numbers of the robot's exact length; the prompt is a
  string of at most `max_prompt_chars` characters.
- The transformed result is the canonical model-input form, the same dtype and shape for every request of
  a model: `image/<camera>` uint8 [224, 224, 3], `image_mask/<camera>` bool [], `tokenized_prompt` int32
  [L], `tokenized_prompt_mask` bool [L] and `state` float32 [action_dim] (the normalized, padded state
  the output transforms read back, as openpi hands it to them).

Every check raises `InvalidRequest` naming the key and what was expected, so a caller serving many robots
can refuse that request alone. Any other exception from the transforms is a server fault and passes
through unchanged, so a bug in a transform is never answered as the client's mistake.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
from flax import traverse_util

from oxygen_jax.errors import InvalidRequest
from oxygen_jax.models.pi05 import Pi05Config
from oxygen_jax.policies import transforms

# A prompt longer than this is refused before tokenizing (the token limit then applies as well).
MAX_PROMPT_CHARS = 2000

Path = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class RawSpec:
    """What a robot sends: the keys its input transforms read, as paths into the (possibly nested) dict.

    cameras: path -> True when the camera is required; vectors: path -> its exact number of values (a
    1-value vector may also arrive as a scalar); channels_first_only: the robot's images are CHW (ALOHA),
    otherwise HWC or CHW.
    """

    cameras: Mapping[Path, bool]
    vectors: Mapping[Path, int]
    channels_first_only: bool = False

    def nested(self, flat: Mapping[str, Any]) -> dict[str, Any]:
        """A raw observation from flat "/"-joined keys, as recordings store it: a key that names one of the
        spec's paths goes to that path (its images back to CHW for a channels-first robot); other keys
        stay as they are."""
        paths = {_name(path): path for path in (*self.cameras, *self.vectors)}
        raw: dict[Path, Any] = {}
        for key, value in flat.items():
            path = paths.get(key, (key,))
            hwc = self.channels_first_only and path in self.cameras and np.shape(value)[-1:] == (3,)
            raw[path] = np.moveaxis(np.asarray(value), -1, 0) if hwc else value
        return traverse_util.unflatten_dict(raw)

    def example(self) -> dict[str, Any]:
        """A blank observation with every camera and vector, to compile a server's programs before any robot
        connects (all cameras: the largest prefix, so the batch state fits every robot of this kind)."""
        size = transforms.IMAGE_SIZE
        image = (3, size, size) if self.channels_first_only else (size, size, 3)
        flat: dict[Path, Any] = {path: np.zeros(image, np.uint8) for path in self.cameras}
        flat |= {path: np.zeros(length, np.float32) for path, length in self.vectors.items()}
        return traverse_util.unflatten_dict(flat) | {"prompt": "warm up"}


@dataclasses.dataclass(frozen=True)
class RobotIO:
    """A robot's `RawSpec` and transform pipeline for one model config."""

    spec: RawSpec
    pipeline: transforms.Pipeline
    config: Pi05Config
    max_prompt_chars: int = MAX_PROMPT_CHARS

    def inputs(self, obs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """One raw observation -> the canonical unbatched model inputs (see the module docstring)."""
        return self.inputs_and_actions(obs, None)[0]

    def inputs_and_actions(
        self, obs: Mapping[str, Any], actions: np.ndarray | None
    ) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
        """`inputs(obs)` and, in the same pass, `actions` (robot action space [H, robot dims], e.g. a chunk
        this robot executes) in this observation's model space [H, action_dim]: the input direction of the
        action transforms, as training makes its targets (delta robots: relative to this observation's
        state; normalized; zero padded). None without `actions`."""
        raw = self.check(obs)
        if actions is not None:
            raw["actions"] = np.asarray(actions)
        data = self.pipeline.inputs(raw)
        model_actions = None if actions is None else np.asarray(data["actions"], np.float32)
        return self._canonical(traverse_util.flatten_dict(data, sep="/")), model_actions

    def outputs(self, state: np.ndarray, actions: np.ndarray) -> dict[str, Any]:
        """Model actions [H, action_dim] -> the robot's outputs (unnormalized, robot action space)."""
        # float32 state, as openpi hands the jax-converted model input state to the output transforms.
        return self.pipeline.outputs({"state": np.asarray(state, np.float32), "actions": actions})

    def check(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        """The known keys of `obs`, each checked (`InvalidRequest` for the first that fails), in the nesting
        the transforms read; no transform runs."""
        if not isinstance(obs, Mapping):
            raise InvalidRequest(f"observation must be a map, got {type(obs).__name__}")
        raw: dict[Path, Any] = {}
        for path, required in self.spec.cameras.items():
            if (image := _lookup(obs, path)) is not None:
                raw[path] = _checked_image(path, image, self.spec.channels_first_only)
            elif required:
                raise InvalidRequest(f"observation is missing {_name(path)!r}; got keys {_keys(obs)}")
        for path, size in self.spec.vectors.items():
            if (value := _lookup(obs, path)) is None:
                raise InvalidRequest(f"observation is missing {_name(path)!r}; got keys {_keys(obs)}")
            raw[path] = _checked_vector(path, value, size)
        if (prompt := _lookup(obs, ("prompt",))) is not None:
            raw[("prompt",)] = _checked_prompt(prompt, self.max_prompt_chars)
        return traverse_util.unflatten_dict(raw)

    def _canonical(self, arrays: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The model's keys only, each with the one dtype and shape every request of this model has."""
        size, dim, length = transforms.IMAGE_SIZE, self.config.action_dim, self.config.max_token_len
        expected = {"state": (np.float32, (dim,))}
        for cam in self.config.image_keys:
            expected[f"image/{cam}"] = (np.uint8, (size, size, 3))
            expected[f"image_mask/{cam}"] = (np.bool_, ())
        expected["tokenized_prompt"] = (np.int32, (length,))
        expected["tokenized_prompt_mask"] = (np.bool_, (length,))
        canonical = {}
        for key, (dtype, shape) in expected.items():
            value = np.asarray(arrays.get(key))
            kinds = {np.uint8: "u", np.bool_: "b", np.int32: "iu", np.float32: "f"}[dtype]
            if value.shape != shape or value.dtype.kind not in kinds:
                raise InvalidRequest(
                    f"{key!r}: expected {np.dtype(dtype)} {list(shape)} after the robot transforms, "
                    f"got {value.dtype} {list(value.shape)}"
                )
            with np.errstate(over="ignore"):
                canonical[key] = value.astype(dtype, copy=False)
        if not np.isfinite(canonical["state"]).all():  # finite raw values too large to normalize
            raise InvalidRequest("'state': values too large: not finite after normalization to float32")
        return canonical


def _name(path: Path) -> str:
    return "/".join(path)


def _keys(obs: Mapping[str, Any]) -> list[str]:
    return sorted(str(key) for key in obs)[:20]


def _lookup(obs: Mapping[str, Any], path: Path) -> Any:
    """The value at `path`, or None where a level is missing or not a map."""
    value: Any = obs
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return value


def _checked_image(path: Path, image: Any, channels_first_only: bool) -> np.ndarray:
    name = _name(path)
    layouts = "[3, H, W]" if channels_first_only else "[H, W, 3] or [3, H, W]"
    if not isinstance(image, np.ndarray) or not (image.dtype == np.uint8 or image.dtype.kind == "f"):
        what = f"{image.dtype} array" if isinstance(image, np.ndarray) else type(image).__name__
        raise InvalidRequest(f"{name!r}: expected a uint8 image, or floats in [0, 1], {layouts}; got {what}")
    channels_first = image.ndim == 3 and image.shape[0] == 3
    if image.ndim != 3 or not (channels_first or (image.shape[-1] == 3 and not channels_first_only)):
        raise InvalidRequest(f"{name!r}: expected one image {layouts}, got shape {list(image.shape)}")
    if min(image.shape) == 0:
        raise InvalidRequest(f"{name!r}: empty image, shape {list(image.shape)}")
    height, width = image.shape[1:] if channels_first else image.shape[:2]
    size = transforms.IMAGE_SIZE
    if int(min(height, width) / (max(height, width) / size)) < 1:  # its short side would resize to 0
        raise InvalidRequest(
            f"{name!r}: a {height}x{width} image is too elongated to resize to {size}x{size}"
        )
    if image.dtype.kind == "f" and not (np.isfinite(image).all() and image.min() >= 0 and image.max() <= 1):
        raise InvalidRequest(f"{name!r}: float images must hold finite values in [0, 1]")
    return image


def _checked_vector(path: Path, value: Any, size: int) -> np.ndarray:
    name = _name(path)
    array = _numeric_array(value)
    if array is None or array.dtype.kind not in "iuf":
        raise InvalidRequest(f"{name!r}: expected {size} numbers, got {type(value).__name__}")
    if array.shape != (size,) and not (size == 1 and array.shape == ()):
        raise InvalidRequest(f"{name!r}: expected {size} values, got shape {list(array.shape)}")
    if not np.isfinite(array).all():
        raise InvalidRequest(f"{name!r}: contains NaN or infinite values")
    return array if array.dtype.kind == "f" else array.astype(np.float64)


def _numeric_array(value: Any) -> np.ndarray | None:
    """`value` as an array when it is one, a number or a list of them; None for other types and for
    ragged lists (which numpy cannot make one array of)."""
    if not isinstance(value, np.ndarray | np.generic | list | tuple | int | float):
        return None
    try:
        return np.asarray(value)
    except ValueError:
        return None


def _checked_prompt(prompt: Any, max_chars: int) -> str:
    if isinstance(prompt, np.ndarray) and prompt.ndim == 0 and prompt.dtype.kind in "US":
        prompt = prompt.item()
    if isinstance(prompt, bytes):
        try:
            prompt = prompt.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InvalidRequest("'prompt': bytes that are not UTF-8") from error
    if not isinstance(prompt, str):
        raise InvalidRequest(f"'prompt': expected a string, got {type(prompt).__name__}")
    if len(prompt) > max_chars:
        raise InvalidRequest(f"'prompt': {len(prompt)} characters, at most {max_chars} are accepted")
    return prompt
