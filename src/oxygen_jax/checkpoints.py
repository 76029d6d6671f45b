"""Read and write openpi pi0.5 checkpoints unchanged.

A checkpoint directory holds `params/` (an orbax PyTreeCheckpointer/OCDBT directory storing
`{"params": <pure nested dict>}`) and usually `assets/<asset_id>/norm_stats.json`. Official
checkpoints and openpi training runs use this layout, so we read them as they are, with no
conversion step that could drift from upstream.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import traverse_util

from oxygen_jax import download
from oxygen_jax.errors import CheckpointError, InvalidArgumentError, UserError

_CACHE_SUBDIR = "openpi-assets/checkpoints"
_TREE_METADATA = "_METADATA"
# orbax's per-step metadata file, which openpi's checkpoints (and the shipped demo model) do not hold.
_STEP_METADATA = "_CHECKPOINT_METADATA"
# openpi's PyTorch checkpoints (converted from the JAX ones) hold this file instead of params/.
_PYTORCH_WEIGHTS = "model.safetensors"

KeyPath = tuple[str, ...]


class CheckpointMismatchError(UserError, ValueError):
    """The checkpoint's parameter tree differs from the one the model expects (usually: another config).

    The message names up to `_SHOWN` paths of each kind; the attributes hold them all.
    """

    _SHOWN = 5

    def __init__(self, missing: list[str], unexpected: list[str], misshaped: list[str]) -> None:
        self.missing = missing
        self.unexpected = unexpected
        self.misshaped = misshaped
        parts = [
            f"{kind}: {'; '.join(paths[: self._SHOWN])}" + _more(len(paths) - self._SHOWN)
            for kind, paths in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped))
            if paths
        ]
        super().__init__(
            f"checkpoint parameters do not match the config's model ({', '.join(parts)}); "
            "is --config the one the checkpoint was trained with?"
        )


def _more(count: int) -> str:
    return f" (and {count} more)" if count > 0 else ""


def _is_params_dir(path: pathlib.Path) -> bool:
    return (path / _TREE_METADATA).is_file()


def _latest_step(run_dir: pathlib.Path) -> pathlib.Path | None:
    """Newest `<run_dir>/<step>` holding params; orbax temp dirs have non-numeric names."""
    steps = [d for d in run_dir.iterdir() if d.name.isdigit() and (d / "params").is_dir()]
    return max(steps, key=lambda d: int(d.name), default=None)


def _match_layout(path: pathlib.Path) -> pathlib.Path | None:
    """The directory holding `params/` for a release, training-run, step or bare params dir."""
    if (path / "params").is_dir():
        return path
    if (path / _PYTORCH_WEIGHTS).is_file():
        raise InvalidArgumentError(
            f"{path} is an openpi PyTorch checkpoint ({_PYTORCH_WEIGHTS}), which is not loaded here: pass "
            f"the JAX checkpoint it was converted from (a folder with params/, e.g. gs://openpi-assets/"
            f"checkpoints/{path.name})"
        )
    if _is_params_dir(path):
        # A params dir under another name has no sibling assets; restore reads it directly.
        return path.parent if path.name == "params" else path
    return _latest_step(path)


def resolve_checkpoint_dir(path_or_name: str | os.PathLike[str]) -> pathlib.Path:
    """Find a checkpoint given a local path, an openpi cache name (`pi05_libero`) or a URL (`gs://...`).

    A URL is downloaded into openpi's cache first, as openpi does, unless a copy is there already.
    Accepts the release layout `<dir>/params`, a training run `<run>/<step>/params` (the highest step
    wins, or the given step dir), and a bare params dir; an openpi PyTorch checkpoint is refused with a
    one-line ValueError. Returns the directory that holds `params/`.
    """
    text = os.fspath(path_or_name)
    cache = download.cache_dir()
    if download.is_url(text):
        candidates = [download.maybe_download(text)]
    else:
        local = pathlib.Path(text).expanduser()
        candidates = [local.absolute()]
        if not local.is_absolute():
            candidates.append(cache / _CACHE_SUBDIR / text)

    tried = []
    for candidate in candidates:
        if not candidate.is_dir():
            tried.append(f"{candidate}: does not exist")
            continue
        found = _match_layout(candidate)
        if found is not None:
            return found.resolve()
        tried.append(f"{candidate}: exists but holds no params/, <step>/params or {_TREE_METADATA}")

    name = pathlib.PurePosixPath(text.rstrip("/")).name
    target = cache / _CACHE_SUBDIR / name
    raise CheckpointError(
        f"no checkpoint found for {text!r} (tried {'; '.join(tried)}); official openpi checkpoints live at "
        f"gs://openpi-assets/checkpoints/<name>: pass that URL to download one into the cache "
        f"($OPENPI_DATA_HOME moves it), or copy it there with "
        f"`gsutil -m cp -r gs://openpi-assets/checkpoints/{name} {target.parent}/`, then pass {name!r}"
    )


class _WithoutStepMetadataNotice(logging.Filter):
    """Drops orbax's warning that a checkpoint has no `_STEP_METADATA`: openpi writes none, so every
    checkpoint this module reads would raise it, and it says nothing wrong with the checkpoint."""

    def filter(self, record: logging.LogRecord) -> bool:
        return _STEP_METADATA not in record.getMessage()


@contextlib.contextmanager
def _quiet_about_step_metadata() -> Iterator[None]:
    orbax_logger = logging.getLogger("absl")  # orbax logs through absl
    notice = _WithoutStepMetadataNotice()
    orbax_logger.addFilter(notice)
    try:
        yield
    finally:
        orbax_logger.removeFilter(notice)


def _params_dir(checkpoint_dir: pathlib.Path) -> pathlib.Path:
    nested = checkpoint_dir / "params"
    return nested if nested.is_dir() else checkpoint_dir


def _key_str(key: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _flatten(tree: Any) -> dict[KeyPath, Any]:
    """Leaves by string path; anything with a `.shape` is a leaf (arrays, ShapeDtypeStruct, metadata)."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: hasattr(x, "shape"))
    return {tuple(_key_str(k) for k in path): leaf for path, leaf in leaves}


def _strip_value(flat: dict[KeyPath, Any]) -> dict[KeyPath, Any]:
    """Drop the trailing `value` level that nnx.State adds when openpi training saves params."""
    if flat and all(path[-1] == "value" for path in flat):
        return {path[:-1]: leaf for path, leaf in flat.items()}
    return flat


def _check_tree(got: dict[KeyPath, Any], expected: dict[KeyPath, Any]) -> None:
    missing = sorted("/".join(p) for p in expected.keys() - got.keys())
    unexpected = sorted("/".join(p) for p in got.keys() - expected.keys())
    misshaped = sorted(
        f"{'/'.join(p)}: checkpoint {tuple(got[p].shape)} vs expected {tuple(expected[p].shape)}"
        for p in expected.keys() & got.keys()
        if tuple(got[p].shape) != tuple(expected[p].shape)
    )
    if missing or unexpected or misshaped:
        raise CheckpointMismatchError(missing, unexpected, misshaped)


def restore_params(
    checkpoint_dir: str | os.PathLike[str],
    *,
    expected: Mapping[str, Any] | None = None,
    dtype: jax.typing.DTypeLike | None = None,
) -> dict[str, Any]:
    """Restore the pure nested param dict as host numpy arrays, optionally cast to `dtype`.

    Host numpy (bfloat16 via ml_dtypes) leaves placement and sharding to the caller's `jax.device_put`,
    so nothing lands on an accelerator before the caller decides where it goes. With `expected` (e.g.
    `jax.eval_shape` output) the tree is checked against the checkpoint metadata before any array is
    read, and every difference is reported in one CheckpointMismatchError.
    """
    path = _params_dir(resolve_checkpoint_dir(checkpoint_dir))
    with _quiet_about_step_metadata(), ocp.PyTreeCheckpointer() as ckptr:
        metadata = ckptr.metadata(path)
        # orbax >= 0.12 wraps the tree in StepMetadata; older versions return it directly.
        item = {"params": getattr(metadata, "item_metadata", metadata)["params"]}
        if expected is not None:
            _check_tree(_strip_value(_flatten(item["params"])), _flatten(expected))
        restore_args = jax.tree.map(
            lambda _: ocp.ArrayRestoreArgs(restore_type=np.ndarray, dtype=dtype), item
        )
        params = ckptr.restore(path, ocp.args.PyTreeRestore(item=item, restore_args=restore_args))["params"]
    return traverse_util.unflatten_dict(_strip_value(_flatten(params)))


def save_params(checkpoint_dir: str | os.PathLike[str], params: Mapping[str, Any]) -> pathlib.Path:
    """Write `<checkpoint_dir>/params` in openpi's release layout, readable by openpi and by us.

    Leaves are stored as jax.Array (with sharding metadata), as in official checkpoints, rather than
    orbax's separate numpy record type.
    """
    path = pathlib.Path(checkpoint_dir).resolve() / "params"
    with ocp.PyTreeCheckpointer() as ckptr:
        ckptr.save(path, {"params": jax.tree.map(jnp.asarray, params)})
    return path


def norm_stats_path(checkpoint_dir: str | os.PathLike[str], asset_id: str) -> pathlib.Path:
    """`<checkpoint>/assets/<asset_id>/norm_stats.json`, naming the asset ids present if it is absent."""
    assets = resolve_checkpoint_dir(checkpoint_dir) / "assets"
    path = assets / asset_id / "norm_stats.json"
    if path.is_file():
        return path
    present = sorted(str(p.parent.relative_to(assets)) for p in assets.rglob("norm_stats.json"))
    raise CheckpointError(
        f"no norm stats for asset id {asset_id!r} at {path}; asset ids present: {present or 'none'}"
    )
