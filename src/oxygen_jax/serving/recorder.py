"""`serve.py --record`: each answered request and its reply saved to disk, as openpi's `--record` does.

The files are those of openpi's `PolicyRecorder`, so tools written for its records read ours:
`<record_dir>/step_<n>.npy` (n counts answered requests from 0) holds a 0-d object array of one flat
dict, `inputs/<key path>` for the observation as the client sent it and `outputs/<key path>` for the
backend's result (before the server adds `server_timing`), nested keys joined by "/". Read one with
`np.load(path, allow_pickle=True).item()`. A request that fails is not recorded, as in openpi.
"""

import itertools
import logging
import pathlib
from typing import Any

import numpy as np
from flax import traverse_util

logger = logging.getLogger(__name__)

# openpi's serve_policy.py records into this folder of the working directory.
DEFAULT_RECORD_DIR = "policy_records"


class RecordingBackend:
    """Wraps a server backend (one with `infer`); every other attribute is the wrapped backend's."""

    trim_request = None  # the server keeps every key: the record holds the request as the client sent it

    def __init__(self, backend: Any, record_dir: str | pathlib.Path) -> None:
        self._backend = backend
        self._record_dir = pathlib.Path(record_dir)
        self._record_dir.mkdir(parents=True, exist_ok=True)
        self._steps = itertools.count()
        logger.info("recording requests and replies to %s", self._record_dir)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    @property
    def metadata(self) -> dict:
        return self._backend.metadata

    def infer(self, obs: dict) -> dict:
        result = self._backend.infer(obs)
        self._save(obs, result)
        return result

    def _save(self, obs: dict, result: dict) -> None:
        data = traverse_util.flatten_dict({"inputs": obs, "outputs": result}, sep="/")
        np.save(self._record_dir / f"step_{next(self._steps)}", np.asarray(data))


class AsyncRecordingBackend(RecordingBackend):
    """Wraps a backend the server awaits (`infer_async`)."""

    async def infer_async(self, obs: dict) -> dict:
        result = await self._backend.infer_async(obs)
        self._save(obs, result)
        return result


def recording(backend: Any, record_dir: str | pathlib.Path = DEFAULT_RECORD_DIR) -> RecordingBackend:
    """`backend` with every answered request recorded under `record_dir`; served the same way as before."""
    kind = AsyncRecordingBackend if hasattr(backend, "infer_async") else RecordingBackend
    return kind(backend, record_dir)
