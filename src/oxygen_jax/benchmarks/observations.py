"""Observation streams for the frame loop: synthetic camera frames, or recorded npz frames."""

import itertools
import pathlib
from collections.abc import Iterator

import numpy as np

from oxygen_jax.errors import MissingFileError
from oxygen_jax.models.pi05 import Pi05Config
from oxygen_jax.tokenizer import Tokenizer

DEFAULT_PROMPT = "pick up the black bowl and place it on the plate"

# Visible cameras per robot. LIBERO and DROID fill two of pi0.5's three image slots (the right wrist slot
# is masked, so its image tokens leave the prefix); ALOHA fills all three.
LAYOUTS = {
    "libero": ("base_0_rgb", "left_wrist_0_rgb"),
    "droid": ("base_0_rgb", "left_wrist_0_rgb"),
    "aloha": ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"),
}


def synthetic_stream(
    config: Pi05Config,
    tokenizer: Tokenizer,
    prompt: str = DEFAULT_PROMPT,
    seed: int = 0,
    cameras: tuple[str, ...] | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """Endless frames of random camera images with a fixed tokenized prompt (batch dim 1); cameras not in
    `cameras` (default: all of the config's) are masked."""
    rng = np.random.default_rng(seed)
    tokens, mask = tokenizer.tokenize(prompt)
    size = config.image_size
    visible = config.image_keys if cameras is None else cameras
    while True:
        frame = {"tokenized_prompt": tokens[None], "tokenized_prompt_mask": mask[None]}
        for cam in config.image_keys:
            frame[f"image/{cam}"] = rng.integers(0, 256, (1, size, size, 3), dtype=np.uint8)
            frame[f"image_mask/{cam}"] = np.array([cam in visible])
        yield frame


def npz_stream(obs_dir: str, loop: bool = True) -> Iterator[dict[str, np.ndarray]]:
    """Frames from `<obs_dir>/*.npz` in name order (model-level keys, batch dim 1), looped."""
    files = sorted(pathlib.Path(obs_dir).glob("*.npz"))
    if not files:
        raise MissingFileError(f"no .npz frames in {obs_dir} (without --obs_dir the stream is synthetic)")

    def load(path: pathlib.Path) -> dict[str, np.ndarray]:
        with np.load(path) as f:
            frame = dict(f)
        return {k: v if k.startswith("image_mask") or v.ndim > 1 else v[None] for k, v in frame.items()}

    return (load(f) for f in (itertools.cycle(files) if loop else files))
