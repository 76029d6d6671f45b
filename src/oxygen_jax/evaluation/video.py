"""Episode videos (mp4), through imageio's ffmpeg plugin (an optional extra)."""

import pathlib
import warnings
from collections.abc import Sequence
from types import ModuleType

import numpy as np

from oxygen_jax.evaluation.requirements import require

INSTALL = "pip install 'imageio[ffmpeg]'"


def video_writer(install: str = INSTALL) -> ModuleType:
    """imageio with its ffmpeg plugin, or a one-line error naming `install`; a script that writes videos
    at the end of a long run calls it first, so a missing writer fails before the slow work."""
    imageio = require("imageio", install=install, purpose="writing videos")
    require("imageio_ffmpeg", install=install, purpose="writing mp4 videos")
    return imageio


def write_video(path: pathlib.Path, frames: Sequence[np.ndarray], fps: float) -> pathlib.Path:
    """H.264 mp4 of uint8 HWC frames, at their own size (no rounding to 16-pixel blocks)."""
    imageio = video_writer()
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        # JAX warns on any fork; imageio forks only to exec ffmpeg, which is safe.
        warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
        imageio.mimwrite(path, [np.asarray(f, np.uint8) for f in frames], fps=fps, macro_block_size=1)
    return path
