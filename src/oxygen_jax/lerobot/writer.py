"""Episodes written as a LeRobot v2.0 dataset (the layout `lerobot.LeRobotDataset` reads, openpi trains on).

Features are taken from the first frame: uint8 [H, W, 3] arrays become PNG images stored in the parquet,
other arrays float32 vectors, strings string columns (e.g. a per-frame subtask). The metadata is brought up
to date after every episode, so an interrupted recording stays a readable dataset.
"""

import io
import json
import pathlib
from collections.abc import Mapping
from typing import Any

import numpy as np
from PIL import Image

from oxygen_jax.lerobot import arrow
from oxygen_jax.lerobot.reader import INDEX_COLUMNS

DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
CHUNKS_SIZE = 1000


def _feature(name: str, value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        return {"dtype": "string", "shape": [1], "names": None}
    array = np.asarray(value)
    if array.dtype == np.uint8 and array.ndim == 3 and array.shape[-1] == 3:
        return {"dtype": "image", "shape": list(array.shape), "names": ["height", "width", "channel"]}
    if array.dtype.kind not in "biuf":
        raise ValueError(f"frame key {name!r}: cannot store {array.dtype} values (arrays, images or strings)")
    return {"dtype": "float32", "shape": list(array.shape) or [1], "names": None}


def _png(image: np.ndarray) -> dict[str, Any]:
    buffer = io.BytesIO()
    Image.fromarray(np.asarray(image, np.uint8)).save(buffer, format="PNG")
    return {"bytes": buffer.getvalue(), "path": None}


class LeRobotWriter:
    """Appends frames to the current episode; `save_episode` writes it and the metadata."""

    def __init__(self, root: str | pathlib.Path, *, fps: float, robot_type: str | None = None) -> None:
        arrow.parquet()  # the missing extra is reported before any frame is made
        self.root = pathlib.Path(root)
        if (self.root / "meta" / "info.json").exists():
            raise FileExistsError(f"{self.root} already holds a dataset; record into a new folder")
        self.fps = fps
        self.robot_type = robot_type
        self.features: dict[str, dict[str, Any]] | None = None
        self._tasks: dict[str, int] = {}
        self._num_episodes = 0
        self._frames: list[dict[str, Any]] = []
        self._total_frames = 0

    def add_frame(self, frame: Mapping[str, Any], task: str) -> None:
        """One frame of the current episode: `frame` maps column names (e.g. `observation.image`,
        `observation.state`, `action`, `subtask`) to values; `task` is the episode's prompt."""
        if self.features is None:
            self.features = {name: _feature(name, value) for name, value in frame.items()}
        if set(frame) != set(self.features):
            raise ValueError(f"frame keys {sorted(frame)} differ from the dataset's {sorted(self.features)}")
        self._frames.append({"frame": dict(frame), "task": task})

    def save_episode(self) -> int:
        """Writes the current episode's parquet file and the metadata; returns the episode index."""
        if not self._frames:
            raise ValueError("save_episode without frames")
        episode = self._num_episodes
        columns: dict[str, list[Any]] = {name: [] for name in [*self.features, *INDEX_COLUMNS]}
        tasks = []
        for i, item in enumerate(self._frames):
            task_index = self._tasks.setdefault(item["task"], len(self._tasks))
            if item["task"] not in tasks:
                tasks.append(item["task"])
            for name, feature in self.features.items():
                value = item["frame"][name]
                if feature["dtype"] == "image":
                    columns[name].append(_png(value))
                elif feature["dtype"] == "string":
                    columns[name].append(str(value))
                else:
                    columns[name].append(np.asarray(value, np.float32).reshape(-1).tolist())
            columns["timestamp"].append(i / self.fps)
            columns["frame_index"].append(i)
            columns["episode_index"].append(episode)
            columns["index"].append(self._total_frames + i)
            columns["task_index"].append(task_index)
        path = self.root / DATA_PATH.format(episode_chunk=episode // CHUNKS_SIZE, episode_index=episode)
        path.parent.mkdir(parents=True, exist_ok=True)
        pa, pq = arrow.parquet()
        pq.write_table(pa.table(columns), path)
        entry = {"episode_index": episode, "tasks": tasks, "length": len(self._frames)}
        self._num_episodes += 1
        self._total_frames += len(self._frames)
        self._frames = []
        self._write_meta(entry)
        return episode

    def _write_meta(self, episode: dict[str, Any]) -> None:
        """info.json and tasks.jsonl rewritten, `episode`'s line appended to episodes.jsonl."""
        meta = self.root / "meta"
        meta.mkdir(parents=True, exist_ok=True)
        features = {
            **self.features,
            "timestamp": {"dtype": "float32", "shape": [1], "names": None},
            **{name: {"dtype": "int64", "shape": [1], "names": None} for name in INDEX_COLUMNS[1:]},
        }
        info = {
            "codebase_version": "v2.0",
            "robot_type": self.robot_type,
            "total_episodes": self._num_episodes,
            "total_frames": self._total_frames,
            "total_tasks": len(self._tasks),
            "total_videos": 0,
            "total_chunks": (self._num_episodes - 1) // CHUNKS_SIZE + 1,
            "chunks_size": CHUNKS_SIZE,
            "fps": self.fps,
            "splits": {"train": f"0:{self._num_episodes}"},
            "data_path": DATA_PATH,
            "video_path": None,
            "features": features,
        }
        # One line per episode appended (rewriting them all would make a long recording quadratic).
        with (meta / "episodes.jsonl").open("a") as episodes:
            episodes.write(json.dumps(episode) + "\n")
        (meta / "info.json").write_text(json.dumps(info, indent=2))
        tasks = [{"task_index": i, "task": t} for t, i in self._tasks.items()]
        (meta / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
