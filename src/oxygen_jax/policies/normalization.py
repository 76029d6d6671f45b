"""Normalization statistics and openpi's z-score / quantile (q01, q99) normalization.

A checkpoint's `assets/<asset_id>/norm_stats.json` holds the statistics the model was trained with; the
formulas and epsilons below are openpi's, so the model sees exactly the inputs it was trained on.
"""

import dataclasses
import json
import pathlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from oxygen_jax.errors import MissingFileError

NORM_STATS_FILE = "norm_stats.json"
_EPS = 1e-6


@dataclasses.dataclass(frozen=True)
class NormStats:
    """Per-dimension statistics of one array (e.g. `state` or `actions`); quantiles are needed by pi0.5."""

    mean: np.ndarray
    std: np.ndarray
    q01: np.ndarray | None = None
    q99: np.ndarray | None = None


def norm_stats_from_dict(data: Mapping[str, Mapping[str, Any]]) -> dict[str, NormStats]:
    """`{key: {"mean": [...], "std": [...], "q01": [...], "q99": [...]}}` -> NormStats (float64 as openpi)."""

    def array(value: Any) -> np.ndarray | None:
        return None if value is None else np.asarray(value, dtype=np.float64)

    return {
        key: NormStats(
            mean=array(stats["mean"]),
            std=array(stats["std"]),
            q01=array(stats.get("q01")),
            q99=array(stats.get("q99")),
        )
        for key, stats in data.items()
    }


def norm_stats_to_dict(norm_stats: Mapping[str, NormStats]) -> dict[str, dict[str, list[float] | None]]:
    """Inverse of `norm_stats_from_dict`, with JSON-ready lists."""
    return {
        key: {
            field.name: None if (value := getattr(stats, field.name)) is None else np.asarray(value).tolist()
            for field in dataclasses.fields(NormStats)
        }
        for key, stats in norm_stats.items()
    }


def _stats_file(path: str | pathlib.Path) -> pathlib.Path:
    """openpi passes the asset directory; a path to the json file itself is accepted too."""
    path = pathlib.Path(path)
    return path if path.suffix == ".json" else path / NORM_STATS_FILE


def load_norm_stats(path: str | pathlib.Path) -> dict[str, NormStats]:
    """Read openpi's `{"norm_stats": {key: {...}}}` from a directory holding norm_stats.json or the file."""
    file = _stats_file(path)
    if not file.is_file():
        raise MissingFileError(f"norm stats file not found at {file}")
    return norm_stats_from_dict(json.loads(file.read_text())["norm_stats"])


def save_norm_stats(path: str | pathlib.Path, norm_stats: Mapping[str, NormStats]) -> pathlib.Path:
    """Write openpi's norm_stats.json format; returns the file written."""
    file = _stats_file(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps({"norm_stats": norm_stats_to_dict(norm_stats)}, indent=2))
    return file


def _quantiles(stats: NormStats) -> tuple[np.ndarray, np.ndarray]:
    if stats.q01 is None or stats.q99 is None:
        raise ValueError("Quantile normalization needs q01 and q99 in the norm stats.")
    return stats.q01, stats.q99


def normalize(x: np.ndarray, stats: NormStats, *, use_quantiles: bool) -> np.ndarray:
    """Normalize the last axis; the stats are cut to x's width, so a shorter input uses the leading dims.

    z-score: `(x - mean) / (std + 1e-6)`; quantile: `(x - q01) / (q99 - q01 + 1e-6) * 2 - 1`.
    """
    dim = x.shape[-1]
    if use_quantiles:
        q01, q99 = _quantiles(stats)
        q01, q99 = q01[..., :dim], q99[..., :dim]
        return (x - q01) / (q99 - q01 + _EPS) * 2.0 - 1.0
    return (x - stats.mean[..., :dim]) / (stats.std[..., :dim] + _EPS)


def unnormalize(x: np.ndarray, stats: NormStats, *, use_quantiles: bool) -> np.ndarray:
    """Invert `normalize` on the last axis of a (possibly model-padded) x.

    Dims beyond the stats' width: z-score pads mean 0 / std 1 (so they become `x * (1 + 1e-6)`), quantile
    passes them through unchanged. Both match openpi bit for bit.
    """
    dim = x.shape[-1]
    if use_quantiles:
        q01, q99 = _quantiles(stats)
        stats_dim = q01.shape[-1]
        if stats_dim < dim:
            head = (x[..., :stats_dim] + 1.0) / 2.0 * (q99 - q01 + _EPS) + q01
            return np.concatenate([head, x[..., stats_dim:]], axis=-1)
        return (x + 1.0) / 2.0 * (q99 - q01 + _EPS) + q01
    mean = pad_to_dim(stats.mean, dim, value=0.0)
    std = pad_to_dim(stats.std, dim, value=1.0)
    return x * (std + _EPS) + mean


def pad_to_dim(x: np.ndarray, target_dim: int, *, axis: int = -1, value: float = 0.0) -> np.ndarray:
    """Pad `axis` up to `target_dim` with `value`; arrays already that wide (or wider) are returned as is."""
    current_dim = x.shape[axis]
    if current_dim >= target_dim:
        return x
    pad_width = [(0, 0)] * x.ndim
    pad_width[axis] = (0, target_dim - current_dim)
    return np.pad(x, pad_width, constant_values=value)
