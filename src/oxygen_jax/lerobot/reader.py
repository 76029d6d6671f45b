"""LeRobot v2.x datasets read from a local folder: the layout openpi fine-tunes on.

    <root>/meta/info.json          fps, features (name -> dtype, shape), data_path / video_path templates
    <root>/meta/episodes.jsonl     one line per episode: episode_index, length, tasks
    <root>/meta/tasks.jsonl        one line per task: task_index, task (the prompt)
    <root>/data/chunk-000/episode_000000.parquet   one row per frame
    <root>/videos/chunk-000/<key>/episode_000000.mp4   only for features of dtype "video"

Images are stored in the parquet (dtype "image": a struct of PNG/JPEG `bytes` and a `path`) or as one
video per episode and camera (dtype "video", decoded with imageio's ffmpeg plugin). Every problem with
the folder is a `DatasetError` whose one-line message names the file and what is wrong.
"""

from __future__ import annotations

import dataclasses
import io
import json
import pathlib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image

from oxygen_jax.errors import UserError
from oxygen_jax.lerobot import arrow

if TYPE_CHECKING:
    import pyarrow as pa

SUPPORTED_VERSIONS = ("v2.0", "v2.1")
# Columns LeRobot writes for every frame, besides the dataset's own features.
INDEX_COLUMNS = ("timestamp", "frame_index", "episode_index", "index", "task_index")


class DatasetError(UserError, ValueError):
    """The dataset folder is missing a file or a column, or holds a malformed one; the message says which."""


@dataclasses.dataclass(frozen=True)
class Episode:
    index: int
    length: int


def _read_json(path: pathlib.Path) -> dict[str, Any]:
    if not path.is_file():
        raise DatasetError(
            f"{path}: missing (a LeRobot dataset has meta/info.json, episodes.jsonl, tasks.jsonl)"
        )
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise DatasetError(f"{path}: invalid JSON ({error})") from error


def _read_jsonl(path: pathlib.Path, keys: Iterable[str]) -> list[dict[str, Any]]:
    """The records of a JSON-lines file, each checked to hold `keys`."""
    if not path.is_file():
        raise DatasetError(
            f"{path}: missing (a LeRobot dataset has meta/info.json, episodes.jsonl, tasks.jsonl)"
        )
    records = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DatasetError(f"{path} line {number}: invalid JSON ({error})") from error
        if missing := [key for key in keys if key not in record]:
            raise DatasetError(f"{path} line {number}: missing {missing}")
        records.append(record)
    return records


def decode_image(value: Any, root: pathlib.Path) -> np.ndarray:
    """One stored image (a `{"bytes", "path"}` struct, raw bytes or a path) -> uint8 [H, W, 3]."""
    if isinstance(value, Mapping):
        value = value.get("bytes") or value.get("path")
    if isinstance(value, str):
        value = (root / value).read_bytes()
    if not isinstance(value, bytes):
        raise DatasetError(f"image cell holds {type(value).__name__}, expected encoded image bytes or a path")
    return np.asarray(Image.open(io.BytesIO(value)).convert("RGB"))


class LeRobotDataset:
    """Metadata of a local LeRobot v2.x dataset, and its episodes column by column."""

    def __init__(self, root: str | pathlib.Path) -> None:
        arrow.parquet()  # the missing extra is reported before any work
        self.root = pathlib.Path(root).expanduser()
        if not self.root.is_dir():
            raise DatasetError(f"{self.root}: no such dataset folder")
        self.info = _read_json(self.root / "meta" / "info.json")
        version = self.info.get("codebase_version")
        if version not in SUPPORTED_VERSIONS:
            raise DatasetError(
                f"{self.root}/meta/info.json: codebase_version {version!r}, supported: {SUPPORTED_VERSIONS}"
            )
        for key in ("fps", "features", "data_path", "chunks_size"):
            if key not in self.info:
                raise DatasetError(f"{self.root}/meta/info.json: missing {key!r}")
        self.fps = float(self.info["fps"])
        self.features: dict[str, dict[str, Any]] = self.info["features"]
        tasks = _read_jsonl(self.root / "meta" / "tasks.jsonl", ("task_index", "task"))
        self.tasks = {int(t["task_index"]): str(t["task"]) for t in tasks}
        episodes = _read_jsonl(self.root / "meta" / "episodes.jsonl", ("episode_index", "length"))
        self.episodes = [Episode(int(e["episode_index"]), int(e["length"])) for e in episodes]

    @property
    def num_frames(self) -> int:
        return sum(e.length for e in self.episodes)

    def require(self, columns: Iterable[str]) -> None:
        """A one-line error naming the first column the dataset lacks (and the ones it has)."""
        known = set(self.features) | set(INDEX_COLUMNS)
        for column in columns:
            if column not in known:
                raise DatasetError(
                    f"{self.root}: no column {column!r}; meta/info.json features: {sorted(self.features)}"
                )

    def _path(self, template_key: str, episode: int, video_key: str | None = None) -> pathlib.Path:
        template = self.info.get(template_key)
        if template is None:
            raise DatasetError(f"{self.root}/meta/info.json: missing {template_key!r}")
        chunk = episode // int(self.info["chunks_size"])
        return self.root / template.format(episode_chunk=chunk, episode_index=episode, video_key=video_key)

    def read_episode(self, episode: Episode, columns: Iterable[str], *, decode_images: bool = True) -> dict:
        """`columns` of one episode: numbers as arrays [T, ...], strings as lists, images as uint8
        [T, H, W, 3] (or, without `decode_images`, the stored cells, for `decode_image` later).
        Video features are always decoded."""
        columns = list(columns)
        self.require(columns)
        path = self._path("data_path", episode.index)
        stored = [c for c in columns if self.features.get(c, {}).get("dtype") != "video"]
        table = self._read_table(path, stored + (["timestamp"] if len(stored) < len(columns) else []))
        if table.num_rows != episode.length:
            raise DatasetError(
                f"{path}: {table.num_rows} rows, but meta/episodes.jsonl says episode {episode.index} has "
                f"{episode.length} frames"
            )
        out = {}
        for column in columns:
            dtype = self.features.get(column, {}).get("dtype")
            if dtype == "video":
                out[column] = self._read_video(episode, column, table.column("timestamp").to_numpy())
            elif dtype == "image":
                cells = table.column(column).to_pylist()
                out[column] = (
                    np.stack([decode_image(c, self.root) for c in cells]) if decode_images else cells
                )
            else:
                out[column] = _column_values(table.column(column), path, column)
        return out

    def _read_table(self, path: pathlib.Path, columns: list[str]) -> pa.Table:
        if not path.is_file():
            raise DatasetError(f"{path}: missing (named by meta/info.json data_path)")
        pa, pq = arrow.parquet()
        try:
            schema = pq.read_schema(path)
            if missing := [c for c in columns if c not in schema.names]:
                raise DatasetError(f"{path}: no column {missing[0]!r}; columns: {schema.names}")
            return pq.read_table(path, columns=columns)
        except (pa.ArrowInvalid, OSError) as error:
            raise DatasetError(f"{path}: not a readable parquet file ({error})") from error

    def _read_video(self, episode: Episode, key: str, timestamps: np.ndarray) -> np.ndarray:
        """The frames of `key` at the rows' timestamps (nearest frame at the dataset's fps)."""
        path = self._path("video_path", episode.index, key)
        if not path.is_file():
            raise DatasetError(f"{path}: missing (named by meta/info.json video_path)")
        try:
            import imageio.v3 as iio
        except ImportError as error:
            raise DatasetError(f"{path}: decoding videos needs `pip install 'imageio[ffmpeg]'`") from error
        try:
            frames = iio.imread(path, plugin="FFMPEG")
        except Exception as error:  # imageio raises plugin-specific types
            raise DatasetError(f"{path}: not a readable video ({error})") from error
        index = np.clip(np.round(np.asarray(timestamps) * self.fps).astype(int), 0, len(frames) - 1)
        return np.asarray(frames[index], np.uint8)


def _column_values(column: pa.ChunkedArray, path: pathlib.Path, name: str) -> Any:
    """A parquet column as numpy ([T] or [T, n] for list columns), or a list of strings."""
    pa, _ = arrow.parquet()
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return column.to_pylist()
    if pa.types.is_list(column.type) or pa.types.is_fixed_size_list(column.type):
        values = column.to_pylist()
        try:
            return np.asarray(values, np.float32 if pa.types.is_floating(column.type.value_type) else None)
        except ValueError as error:
            raise DatasetError(f"{path}: column {name!r} has rows of different lengths") from error
    return column.to_numpy()
