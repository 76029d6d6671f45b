"""Pieces every evaluation loop shares: the policy (in-process or over the openpi websocket protocol),
action chunking, control-rate measurement, videos, results files and progress output.

Simulator packages are optional extras, so they are imported only through `require`, which turns a
missing one into an error that names the install command instead of a bare ImportError.
"""

import collections
import ctypes.util
import dataclasses
import importlib
import json
import os
import pathlib
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np
import tqdm

from oxygen_jax.errors import UserError

T = TypeVar("T")


class SetupError(UserError, RuntimeError):
    """The evaluation cannot start: CLIs report it in one line instead of a traceback."""


class MissingDependencyError(SetupError):
    """An optional package or system library that this evaluation needs is not installed."""


class EvalPolicy(Protocol):
    """What a loop drives: openpi's `infer(obs) -> {"actions": [H, dims], ...}` plus server metadata."""

    @property
    def metadata(self) -> Mapping[str, Any]: ...

    def infer(self, obs: dict) -> dict: ...


class EpisodeRecorder(Protocol):
    """Where a loop records its episodes (`training.data.lerobot_writer.LeRobotWriter`)."""

    def add_frame(self, frame: Mapping[str, Any], task: str) -> None: ...

    def save_episode(self) -> int: ...


def require(module: str, *, install: str, purpose: str) -> Any:
    """Imports an optional dependency, or says how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise MissingDependencyError(
            f"{purpose} needs the `{module}` package ({error}); install it with: {install}"
        ) from error


# MUJOCO_GL backend -> the system library it loads, and the Debian package that provides it.
_GL_LIBRARIES = {"egl": ("EGL", "libegl1"), "osmesa": ("OSMesa", "libosmesa6")}


def configure_mujoco_gl() -> str:
    """Picks MuJoCo's offscreen renderer before any simulator is imported (they read MUJOCO_GL then).

    An explicit MUJOCO_GL wins; otherwise EGL where libEGL exists, else OSMesa.
    """
    backend = os.environ.get("MUJOCO_GL")
    if not backend:
        backend = next((b for b, (lib, _) in _GL_LIBRARIES.items() if ctypes.util.find_library(lib)), None)
        if backend is None:
            raise MissingDependencyError(
                "no offscreen renderer for MuJoCo: neither libEGL nor libOSMesa is installed; "
                "run `apt-get update && apt-get install -y libosmesa6` (MUJOCO_GL=osmesa is then used)"
            )
        os.environ["MUJOCO_GL"] = backend
    if backend in _GL_LIBRARIES:
        library, package = _GL_LIBRARIES[backend]
        if not ctypes.util.find_library(library):
            raise MissingDependencyError(
                f"MUJOCO_GL={backend} needs lib{library}: `apt-get update && apt-get install -y {package}`"
            )
        os.environ.setdefault("PYOPENGL_PLATFORM", backend)
    return backend


def renderer_hint(error: Exception) -> str:
    """A failed first render usually means the chosen GL backend does not work on this machine."""
    backend = os.environ.get("MUJOCO_GL", "")
    other = "osmesa" if backend == "egl" else "egl"
    return (
        f"{type(error).__name__}: {error}\nMuJoCo offscreen rendering failed with MUJOCO_GL={backend!r}; "
        f"try MUJOCO_GL={other} (osmesa needs `apt-get install -y libosmesa6`)"
    )


class RemotePolicy:
    """openpi's own websocket client, as a robot would use it, talking to scripts/serve.py."""

    def __init__(self, host: str, port: int) -> None:
        client = require(
            "openpi_client.websocket_client_policy",
            # openpi-client pins numpy<2, which jax cannot use; its code works on numpy 2.
            install="pip install --no-deps openpi-client",
            purpose="--policy=remote",
        )
        try:
            self._client = client.WebsocketClientPolicy(host, port)
        except OSError as error:
            raise SetupError(
                f"no policy server at ws://{host}:{port} ({error}); start one with "
                "`python scripts/serve.py --env=... --config=... --port=...`"
            ) from error

    @property
    def metadata(self) -> Mapping[str, Any]:
        return self._client.get_server_metadata()

    def infer(self, obs: dict) -> dict:
        return self._client.infer(obs)


def local_policy(
    robot: str,
    config_name: str,
    checkpoint_dir: str | None,
    *,
    overrides: Mapping[str, Any] | None = None,
    max_text_tokens: int = 0,
    tokenizer_path: str | None = None,
    num_steps: int | None = None,
    params_dtype: str | None = "bfloat16",
) -> EvalPolicy:
    """An in-process policy for `robot` on a config (name or path) and an openpi checkpoint."""
    from oxygen_jax.policies.policy import create_policy

    return create_policy(
        config_name,
        checkpoint_dir,
        tokenizer_path=tokenizer_path,
        max_text_tokens=max_text_tokens,
        num_steps=num_steps,
        params_dtype=params_dtype,
        # The robot is the evaluation's, whichever robot the config was written for.
        overrides={**(overrides or {}), "robot": robot},
    )


def policy_for(robot: str, kind: str, host: str, port: int, **local: Any) -> EvalPolicy:
    """A served policy (`kind="remote"`, at host:port), or a `local_policy(robot, **local)`."""
    return RemotePolicy(host, port) if kind == "remote" else local_policy(robot, **local)


def recorder_for(record_dir: str | None, fps: float, robot_type: str) -> EpisodeRecorder | None:
    """A LeRobot dataset writer into the new folder `record_dir`, or None without one."""
    if not record_dir:
        return None
    from oxygen_jax.training.data.lerobot_writer import LeRobotWriter

    try:
        return LeRobotWriter(record_dir, fps=fps, robot_type=robot_type)
    except FileExistsError as error:
        raise SetupError(str(error)) from error


@dataclasses.dataclass(frozen=True)
class Replan:
    """One policy call of a rollout: when, how long it took, and what the model said."""

    step: int
    latency_ms: float
    text: str | None


def recorded_frame(obs: Mapping[str, Any], action: np.ndarray, text: str) -> dict[str, Any]:
    """One control step as dataset columns: the observation sent to the policy under its own keys (nested
    ones joined by "/", CHW images turned HWC, the prompt left to the episode's task), the executed
    `action` and the last `text` the policy said ("" before it said any)."""
    frame: dict[str, Any] = {}

    def add(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for key, item in value.items():
                add(f"{prefix}{key}/", item)
            return
        array = np.asarray(value)
        if array.dtype == np.uint8 and array.ndim == 3 and array.shape[0] == 3 and array.shape[-1] != 3:
            array = np.moveaxis(array, 0, -1)
        frame[prefix[:-1]] = array

    add("", {key: value for key, value in obs.items() if key != "prompt"})
    frame["action"] = np.asarray(action, np.float32)
    frame["text"] = text
    return frame


class ActionChunker:
    """Queries the policy every `replan_steps` control steps and executes the head of each chunk, as
    openpi's LIBERO loop and `ActionChunkBroker` do; the rest of each chunk is dropped.

    With a `recorder`, every control step's observation, executed action and the policy's latest text
    are recorded (the observation is then built every step, not only at replans); `end_episode` closes
    the recorded episode."""

    def __init__(
        self, policy: EvalPolicy, replan_steps: int, recorder: EpisodeRecorder | None = None
    ) -> None:
        if replan_steps < 1:
            raise ValueError(f"replan_steps must be >= 1, got {replan_steps}")
        horizon = policy.metadata.get("action_horizon")
        if horizon is not None and replan_steps > horizon:
            raise SetupError(f"replan_steps {replan_steps} exceeds the policy's action horizon {horizon}")
        self._policy = policy
        self._replan_steps = replan_steps
        self._plan: collections.deque[np.ndarray] = collections.deque()
        self._recorder = recorder
        self._recorded = 0
        self._text = ""

    def reset(self) -> None:
        self._plan.clear()
        self._text = ""

    def end_episode(self) -> None:
        """Saves the recorded episode (nothing without a recorder or recorded steps)."""
        if self._recorder is not None and self._recorded:
            self._recorder.save_episode()
        self._recorded = 0

    def act(self, step: int, make_obs: Callable[[], dict]) -> tuple[np.ndarray, Replan | None]:
        """The action for this step; builds the observation (and replans) only when the plan is empty,
        or every step when recording."""
        replan = None
        obs = make_obs() if self._recorder is not None else None
        if not self._plan:
            start = time.perf_counter()
            result = self._policy.infer(make_obs() if obs is None else obs)
            latency_ms = (time.perf_counter() - start) * 1000
            chunk = np.asarray(result["actions"])
            if chunk.ndim != 2 or len(chunk) < self._replan_steps:
                raise ValueError(
                    f"expected an action chunk [H >= {self._replan_steps}, dims], got {list(chunk.shape)}"
                )
            self._plan.extend(chunk[: self._replan_steps])
            text = result.get("text")
            replan = Replan(step, latency_ms, None if text is None else str(text))
            self._text = self._text if text is None else str(text)
        action = self._plan.popleft()
        if obs is not None:
            self._recorder.add_frame(recorded_frame(obs, action, self._text), task=str(obs.get("prompt", "")))
            self._recorded += 1
        return action, replan


class RateMeter:
    """Achieved control rate: control steps per second of wall time, inference and simulation included."""

    def __init__(self) -> None:
        self._start = time.perf_counter()
        self.steps = 0

    def tick(self) -> None:
        self.steps += 1

    @property
    def hz(self) -> float:
        elapsed = time.perf_counter() - self._start
        return self.steps / elapsed if elapsed > 0 else 0.0


class Pacer:
    """Holds a loop to `hz` (a real robot's control rate) and counts the steps that overran it."""

    def __init__(self, hz: float) -> None:
        self._period = 1.0 / hz
        self._deadline = time.perf_counter() + self._period
        self.late_steps = 0

    def wait(self) -> None:
        remaining = self._deadline - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)
        else:
            self.late_steps += 1
        # A late step restarts the schedule instead of rushing the next ones to catch up.
        self._deadline = max(self._deadline, time.perf_counter()) + self._period


def episode_record(replans: Sequence[Replan], meter: RateMeter) -> dict[str, Any]:
    """The timing and language fields every loop's per-episode results share."""
    latencies = [r.latency_ms for r in replans]
    return {
        "steps": meter.steps,
        "control_hz": round(meter.hz, 3),
        "replans": len(replans),
        "infer_ms": latency_summary(latencies),
        "texts": [{"step": r.step, "text": r.text} for r in replans if r.text is not None],
    }


def latency_summary(latencies_ms: Sequence[float]) -> dict[str, float] | None:
    if not latencies_ms:
        return None
    values = np.asarray(latencies_ms)
    # The first call includes compilation, so the median is the steady-state number to read.
    return {
        "first": round(float(values[0]), 2),
        "median": round(float(np.median(values)), 2),
        "p95": round(float(np.percentile(values, 95)), 2),
        "max": round(float(values.max()), 2),
    }


def progress(iterable: Iterable[T], desc: str, *, leave: bool = True) -> Iterable[T]:
    """A tqdm bar on terminals; silent in logs (CI), where the per-episode lines say enough."""
    return tqdm.tqdm(iterable, desc=desc, leave=leave, dynamic_ncols=True, disable=None)


def echo(message: str) -> None:
    """Prints a line without breaking the progress bars."""
    tqdm.tqdm.write(message)


def write_video(path: pathlib.Path, frames: Sequence[np.ndarray], fps: float) -> pathlib.Path:
    """H.264 mp4 of uint8 HWC frames, at their own size (no rounding to 16-pixel blocks)."""
    install = "pip install 'imageio[ffmpeg]'"
    imageio = require("imageio", install=install, purpose="writing videos")
    require("imageio_ffmpeg", install=install, purpose="writing mp4 videos")
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        # JAX warns on any fork; imageio forks only to exec ffmpeg, which is safe.
        warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
        imageio.mimwrite(path, [np.asarray(f, np.uint8) for f in frames], fps=fps, macro_block_size=1)
    return path


def write_json(path: pathlib.Path, data: Mapping[str, Any]) -> None:
    """Written atomically after every episode, so an interrupted run keeps what it measured."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=_to_json) + "\n")
    tmp.replace(path)


def _to_json(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, pathlib.Path):
        return str(value)
    raise TypeError(f"not JSON-serializable: {type(value).__name__}")


def format_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table with left-aligned columns (first) and right-aligned ones (the rest)."""
    cells = [[str(c) for c in header], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        )

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(row) for row in cells[1:])])
