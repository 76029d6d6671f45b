"""DROID: the client loop of a real Franka DROID station, and an offline replay of recorded observations.

Both run the same rollout: at 15 Hz (DROID's data-collection rate) the robot sends the openpi DROID request
(one exterior and the wrist camera, resized with padding to 224 on the robot side to save bandwidth,
7 joint positions and the gripper) every `open_loop_horizon` steps and executes that many actions of each
chunk: joint velocities and a gripper position, binarized at 0.5 and clipped to [-1, 1].

On a robot an operator types each instruction and scores each rollout into a CSV. The replay streams
recorded frames (a folder of npz files, or a synthetic stream) through the same loop and reports the
actions it would have sent, the model's text and the timing: whether the policy keeps up with 15 Hz.
"""

import contextlib
import csv
import dataclasses
import datetime
import importlib
import itertools
import json
import pathlib
import signal
import threading
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import numpy as np

from oxygen_jax.evaluation import chunking, console, pacing, policies, recording, records, requirements, video
from oxygen_jax.policies import image_tools

CONTROL_HZ = 15
ACTION_DIM = 8
EXTERIOR_KEY = "observation/exterior_image_1_left"
WRIST_KEY = "observation/wrist_image_left"
IMAGE_KEYS = (EXTERIOR_KEY, WRIST_KEY)
REQUIRED_KEYS = (*IMAGE_KEYS, "observation/joint_position", "observation/gripper_position")
CSV_FIELDS = (
    "rollout",
    "started",
    "prompt",
    "success",
    "steps",
    "duration_s",
    "control_hz",
    "late_steps",
    "infer_ms_median",
    "video",
    "texts",
)


@dataclasses.dataclass(frozen=True)
class Settings:
    max_steps: int = 600
    # 8 actions = 0.5 s of motion between policy calls.
    open_loop_horizon: int = 8
    # None: as fast as the policy answers (replay only; a robot needs its control rate).
    control_hz: float | None = CONTROL_HZ
    save_video: bool = True


class Source(Protocol):
    """Where observations come from and actions go: the robot, or a recording."""

    def observe(self) -> dict | None:
        """The DROID observation (openpi keys, full-size images), or None when the stream ends."""
        ...

    def apply(self, action: np.ndarray) -> None: ...


def request(observation: dict, prompt: str) -> dict:
    """Full-size DROID observation -> the openpi request, images resized with padding to 224."""
    out = {
        k: image_tools.resize_with_pad(v, 224, 224) if k in IMAGE_KEYS else v for k, v in observation.items()
    }
    out.setdefault("prompt", prompt)
    return out


def to_robot_command(action: np.ndarray) -> np.ndarray:
    """Model action -> what the DROID robot executes: binary gripper, everything within [-1, 1]."""
    action = np.asarray(action, np.float64)
    if action.shape != (ACTION_DIM,):
        raise ValueError(
            f"expected {ACTION_DIM}-d DROID actions (7 joint velocities + gripper), got {action.shape}"
        )
    command = action.copy()
    command[-1] = 1.0 if action[-1] > 0.5 else 0.0
    return np.clip(command, -1.0, 1.0)


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[None]:
    """Holds back Ctrl+C while a policy call is in flight, so stopping a rollout early does not break the
    connection to the server mid-request; the interrupt is raised once the call returns."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    interrupted = False

    def remember(signum: int, frame: Any) -> None:
        nonlocal interrupted
        interrupted = True

    previous = signal.signal(signal.SIGINT, remember)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupted:
        raise KeyboardInterrupt


def rollout(
    policy: policies.EvalPolicy,
    source: Source,
    prompt: str,
    settings: Settings,
    recorder: recording.EpisodeRecorder | None = None,
) -> dict:
    """One rollout until `max_steps`, the end of the stream, or Ctrl+C; returns its record plus the
    executed `actions` [T, 8] and the exterior camera `frames` (and records it as one episode)."""
    chunker = chunking.ActionChunker(policy, settings.open_loop_horizon, recorder)
    pacer = pacing.Pacer(settings.control_hz) if settings.control_hz else None
    meter = pacing.RateMeter()
    frames, actions, replans = [], [], []
    try:
        for step in console.progress(range(settings.max_steps), "steps", leave=False):
            observation = source.observe()
            if observation is None:
                break
            if settings.save_video:
                frames.append(np.asarray(observation[EXTERIOR_KEY]))
            with deferred_interrupt():
                action, replan = chunker.act(step, lambda o=observation: request(o, prompt))
            chunking.keep_replan(replans, replan)
            command = to_robot_command(action)
            source.apply(command)
            actions.append(command)
            meter.tick()
            if pacer is not None:
                pacer.wait()
    except KeyboardInterrupt:
        console.echo("rollout stopped (Ctrl+C)")
    chunker.end_episode()
    record = records.episode_record(replans, meter)
    record["late_steps"] = pacer.late_steps if pacer is not None else None
    record["actions"] = np.asarray(actions, np.float64).reshape(-1, ACTION_DIM)
    record["frames"] = frames
    return record


# ---- Replay ----


class ReplaySource:
    """Recorded observations; the actions go nowhere (they are reported instead)."""

    def __init__(self, frames: Iterable[dict]) -> None:
        self._frames = iter(frames)

    def observe(self) -> dict | None:
        return next(self._frames, None)

    def apply(self, action: np.ndarray) -> None:
        del action


def load_frames(folder: pathlib.Path) -> Iterator[dict]:
    """`*.npz` files in name order, each one observation in openpi DROID keys (an optional `prompt`)."""
    paths = sorted(folder.glob("*.npz"))
    if not paths:
        raise requirements.SetupError(f"no .npz frames in {folder}")
    return map(_load_frame, paths)


def _load_frame(path: pathlib.Path) -> dict:
    with np.load(path) as npz:
        frame = {k: npz[k] for k in npz.files}
    missing = [k for k in REQUIRED_KEYS if k not in frame]
    if missing:
        raise requirements.SetupError(f"{path}: missing {missing}; has {sorted(frame)}")
    if "prompt" in frame:
        frame["prompt"] = str(frame["prompt"])
    return frame


def synthetic_frames(count: int, seed: int = 0, image_size: tuple[int, int] = (180, 320)) -> Iterator[dict]:
    """A stand-in DROID stream: camera-shaped noise images and a slowly drifting arm."""
    rng = np.random.default_rng(seed)
    joints = rng.uniform(-1.0, 1.0, 7)
    for _ in range(count):
        joints = joints + rng.normal(0.0, 0.01, 7)
        yield {
            EXTERIOR_KEY: rng.integers(0, 256, (*image_size, 3), dtype=np.uint8),
            WRIST_KEY: rng.integers(0, 256, (*image_size, 3), dtype=np.uint8),
            "observation/joint_position": joints.copy(),
            "observation/gripper_position": rng.uniform(0.0, 1.0, 1),
        }


def replay(
    policy: policies.EvalPolicy,
    frames: Iterable[dict],
    prompt: str,
    settings: Settings,
    out_dir: pathlib.Path,
    info: dict,
    recorder: recording.EpisodeRecorder | None = None,
) -> dict:
    """Streams `frames` through the robot loop; writes results.json, actions.npz and a video."""
    record = rollout(policy, ReplaySource(frames), prompt, settings, recorder)
    out_dir.mkdir(parents=True, exist_ok=True)
    np.savez(out_dir / "actions.npz", actions=record.pop("actions"))
    frames_seen = record.pop("frames")
    if settings.save_video and frames_seen:
        record["video"] = str(
            video.write_video(out_dir / "replay.mp4", frames_seen, CONTROL_HZ).relative_to(out_dir)
        )
    results = {
        "env": "droid",
        "mode": "replay",
        "prompt": prompt,
        "settings": dataclasses.asdict(settings),
        "policy": {**info, "metadata": dict(policy.metadata)},
        "rollout": {**record, "actions": "actions.npz"},
    }
    records.write_json(out_dir / "results.json", results)
    return results


# ---- Robot ----


@dataclasses.dataclass(frozen=True)
class Cameras:
    """Which ZED cameras feed the policy (ids as printed on the cameras, e.g. "24259877")."""

    left_id: str
    right_id: str
    wrist_id: str
    # The one exterior camera the policy sees: "left" or "right".
    external: str = "left"


class Operator(Protocol):
    """The person running the robot: instructions in, scores out."""

    def instruction(self) -> str:
        """The next instruction; empty to finish the session."""
        ...

    def success(self) -> float:
        """The last rollout's success in [0, 1]."""
        ...


class ConsoleOperator:
    def instruction(self) -> str:
        return input("Instruction (empty to finish): ").strip()

    def success(self) -> float:
        while True:
            answer = input("Success? y (100%), n (0%) or a score 0-100: ").strip().lower()
            score = {"y": 100.0, "n": 0.0}.get(answer)
            if score is None:
                try:
                    score = float(answer)
                except ValueError:
                    continue
            if 0.0 <= score <= 100.0:
                return score / 100.0


def load_robot_env() -> Any:
    """The DROID station's `RobotEnv` (the `droid` package, `r2d2` before its rename) in the action spaces
    the DROID policies were trained on: joint velocities and an absolute gripper position."""
    errors = []
    for module in ("droid.robot_env", "r2d2.robot_env"):
        try:
            robot_env = importlib.import_module(module)
        except ImportError as error:
            errors.append(f"{module}: {error}")
            continue
        return robot_env.RobotEnv(action_space="joint_velocity", gripper_action_space="position")
    raise requirements.MissingDependencyError(
        "the DROID robot loop needs the DROID robot stack (the `droid` package, formerly `r2d2`, from the "
        "DROID repository, installed on the robot's control computer); without a robot, use --mode=replay. "
        f"Import errors: {'; '.join(errors)}"
    )


class RobotSource:
    """A live DROID `RobotEnv`: camera images picked by id, BGRA -> RGB."""

    def __init__(self, env: Any, cameras: Cameras) -> None:
        self._env = env
        self._cameras = cameras

    def observe(self) -> dict:
        raw = self._env.get_observation()
        images = {}
        for name, camera_id in (
            ("left", self._cameras.left_id),
            ("right", self._cameras.right_id),
            ("wrist", self._cameras.wrist_id),
        ):
            # Each ZED is a stereo pair; the policies were trained on the left images only.
            keys = [k for k in raw["image"] if camera_id in k and "left" in k]
            if not keys:
                raise requirements.SetupError(
                    f"no left image of camera {camera_id} ({name}); got {sorted(raw['image'])}"
                )
            images[name] = np.ascontiguousarray(np.asarray(raw["image"][keys[0]])[..., :3][..., ::-1])
        state = raw["robot_state"]
        return {
            EXTERIOR_KEY: images[self._cameras.external],
            WRIST_KEY: images["wrist"],
            "observation/joint_position": np.asarray(state["joint_positions"], np.float64),
            "observation/gripper_position": np.atleast_1d(np.asarray(state["gripper_position"], np.float64)),
        }

    def apply(self, action: np.ndarray) -> None:
        self._env.step(action)


def run_robot(
    policy: policies.EvalPolicy,
    env: Any,
    cameras: Cameras,
    operator: Operator,
    settings: Settings,
    out_dir: pathlib.Path,
    recorder: recording.EpisodeRecorder | None = None,
) -> pathlib.Path:
    """Rollouts until the operator gives an empty instruction; one CSV row per scored rollout."""
    if cameras.external not in ("left", "right"):
        raise requirements.SetupError(f"external camera must be 'left' or 'right', got {cameras.external!r}")
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / f"droid_eval_{datetime.datetime.now():%Y%m%d_%H%M%S}.csv"
    source = RobotSource(env, cameras)
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for index in itertools.count():
            prompt = operator.instruction()
            if not prompt:
                break
            started = datetime.datetime.now()
            console.echo("rolling out; Ctrl+C stops early")
            record = rollout(policy, source, prompt, settings, recorder)
            duration = (datetime.datetime.now() - started).total_seconds()
            video_name = ""
            if settings.save_video and record["frames"]:
                path = video.write_video(out_dir / f"rollout_{index:03d}.mp4", record["frames"], CONTROL_HZ)
                video_name = path.name
            writer.writerow(
                {
                    "rollout": index,
                    "started": started.isoformat(timespec="seconds"),
                    "prompt": prompt,
                    "success": operator.success(),
                    "steps": record["steps"],
                    "duration_s": round(duration, 2),
                    "control_hz": record["control_hz"],
                    "late_steps": record["late_steps"],
                    "infer_ms_median": (record["infer_ms"] or {}).get("median"),
                    "video": video_name,
                    "texts": json.dumps(record["texts"]),
                }
            )
            f.flush()
            env.reset()
    return csv_path
