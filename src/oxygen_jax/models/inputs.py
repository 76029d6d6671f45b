"""Model-level inputs from plain arrays: validation with errors that name the key, and synthetic data.

Keys are openpi's model-level names: `image/<camera>` ([B, H, W, 3] float32 in [-1, 1] or uint8),
`image_mask/<camera>` ([B] bool), `tokenized_prompt` ([B, L] int), `tokenized_prompt_mask` ([B, L] bool),
and optionally `state` ([B, S]) and `noise` ([B, horizon, action_dim]).
"""

from collections.abc import Mapping

import numpy as np

from oxygen_jax.errors import UserError
from oxygen_jax.models.pi05 import Observation, Pi05Config


class InputError(UserError, ValueError):
    """An input array is missing or malformed; the message names the key and what was expected."""


def require_array(arrays: Mapping[str, np.ndarray], key: str) -> np.ndarray:
    """arrays[key] as numpy, or an InputError naming the keys that are there."""
    if key not in arrays:
        raise InputError(f"missing input {key!r}; got keys {sorted(arrays)}")
    return np.asarray(arrays[key])


def check_array(key: str, value: np.ndarray, shape: tuple, kinds: str, what: str) -> None:
    """dtype kind in `kinds`, shape matching `shape` (None: any size), finite floats; else InputError."""
    if value.dtype.kind not in kinds:
        raise InputError(f"{key!r}: expected {what}, got dtype {value.dtype}")
    if len(value.shape) != len(shape) or any(
        s is not None and s != v for s, v in zip(shape, value.shape, strict=True)
    ):
        expected = "[" + ", ".join("?" if s is None else str(s) for s in shape) + "]"
        raise InputError(f"{key!r}: expected shape {expected} ({what}), got {list(value.shape)}")
    if value.dtype.kind == "f" and not np.isfinite(value).all():
        raise InputError(f"{key!r}: contains NaN or infinite values")


def image_to_float(image: np.ndarray) -> np.ndarray:
    """uint8 [0, 255] -> float32 [-1, 1] (openpi's convention); float images pass through."""
    if image.dtype == np.uint8:
        return image.astype(np.float32) / 255.0 * 2.0 - 1.0
    return image.astype(np.float32)


def observation_from_arrays(arrays: Mapping[str, np.ndarray], config: Pi05Config) -> Observation:
    """Validates model-level arrays and packs them into an Observation (images as float32)."""
    prompt = require_array(arrays, "tokenized_prompt")
    check_array("tokenized_prompt", prompt, (None, None), "iu", "int token ids [B, L]")
    batch = prompt.shape[0]
    prompt_mask = require_array(arrays, "tokenized_prompt_mask")
    check_array("tokenized_prompt_mask", prompt_mask, prompt.shape, "b", "bool [B, L]")
    if prompt.shape[1] > config.max_token_len:
        raise InputError(
            f"'tokenized_prompt': length {prompt.shape[1]} exceeds max_token_len {config.max_token_len}"
        )
    if ((prompt < 0) | (prompt >= config.vocab_size)).any():
        raise InputError(f"'tokenized_prompt': ids must lie in [0, {config.vocab_size})")
    size = config.image_size
    images, masks = {}, {}
    for cam in config.image_keys:
        image = require_array(arrays, f"image/{cam}")
        what = "uint8 or float32 in [-1, 1] [B, H, W, 3]"
        check_array(f"image/{cam}", image, (batch, size, size, 3), "uf", what)
        if image.dtype.kind == "u" and image.dtype != np.uint8:  # only uint8 is rescaled to [-1, 1]
            raise InputError(f"'image/{cam}': expected {what}, got dtype {image.dtype}")
        images[cam] = image_to_float(image)
        mask_key = f"image_mask/{cam}"
        mask = np.asarray(arrays[mask_key]) if mask_key in arrays else np.ones(batch, bool)
        check_array(mask_key, mask, (batch,), "b", "bool [B]")
        masks[cam] = mask
    return Observation(
        images=images,
        image_masks=masks,
        tokenized_prompt=prompt.astype(np.int32),
        tokenized_prompt_mask=prompt_mask,
    )


def noise_from_arrays(arrays: Mapping[str, np.ndarray], config: Pi05Config, batch: int) -> np.ndarray | None:
    if "noise" not in arrays:
        return None
    noise = np.asarray(arrays["noise"])
    check_array(
        "noise",
        noise,
        (batch, config.action_horizon, config.action_dim),
        "f",
        "float [B, horizon, action_dim]",
    )
    return noise.astype(np.float32)


def synthetic_arrays(config: Pi05Config, batch: int = 1, prompt_len: int = 12, seed: int = 0) -> dict:
    """A plausible random observation (uint8 images, a short prompt) for demos and benchmarks."""
    rng = np.random.default_rng(seed)
    size = config.image_size
    arrays = {}
    for cam in config.image_keys:
        arrays[f"image/{cam}"] = rng.integers(0, 256, (batch, size, size, 3), dtype=np.uint8)
        arrays[f"image_mask/{cam}"] = np.ones(batch, bool)
    prompt_len = min(prompt_len, config.max_token_len)
    tokens = np.zeros((batch, config.max_token_len), np.int32)
    tokens[:, 0] = 2  # bos
    tokens[:, 1:prompt_len] = rng.integers(4, config.vocab_size, (batch, prompt_len - 1))
    arrays["tokenized_prompt"] = tokens
    arrays["tokenized_prompt_mask"] = np.arange(config.max_token_len)[None, :] < prompt_len
    arrays["state"] = rng.uniform(-1, 1, (batch, config.action_dim)).astype(np.float32)
    return arrays
