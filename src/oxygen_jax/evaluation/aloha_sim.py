"""ALOHA simulation (gym-aloha): bimanual cube transfer and peg insertion, scored by the task reward.

Observations are what openpi's ALOHA sim client sends: the top camera resized with padding to 224 as CHW
uint8 (`images/cam_high`) and the 14 joint positions (`state`). An episode succeeds when it reaches the
task's maximum reward (4: the cube lifted by the second arm, or the peg inserted).
"""

import dataclasses
import pathlib
from typing import Any

import numpy as np

from oxygen_jax.errors import install_hint
from oxygen_jax.evaluation import (
    chunking,
    console,
    mujoco_pair,
    pacing,
    policies,
    recording,
    records,
    rendering,
    requirements,
    video,
)
from oxygen_jax.policies import image_tools

# Task -> the prompt the ALOHA sim models were trained with.
TASKS = {
    "AlohaTransferCube-v0": "Transfer cube",
    "AlohaInsertion-v0": "Insert the peg into the socket",
}
CONTROL_HZ = 50
INSTALL = install_hint("aloha")


@dataclasses.dataclass(frozen=True)
class Settings:
    task: str = "AlohaTransferCube-v0"
    episodes: int = 1
    # gym-aloha's own time limit; every episode ends at the first of this and success.
    max_steps: int = 300
    replan_steps: int = 10
    seed: int = 0
    prompt: str | None = None
    save_video: bool = True


def check_simulator() -> Any:
    """Renderer, packages and the mujoco/dm-control pair, checked before a policy takes its time to load;
    returns `gymnasium`."""
    if problem := mujoco_pair.installed_mismatch():
        raise requirements.SetupError(problem)
    rendering.configure_mujoco_gl()
    requirements.require("gym_aloha", install=INSTALL, purpose="the ALOHA simulation")
    return requirements.require("gymnasium", install=INSTALL, purpose="the ALOHA simulation")


def make_env(task: str) -> Any:
    """A gym-aloha env with the top camera and joint positions; fails with install/renderer hints."""
    if task not in TASKS:
        raise requirements.SetupError(f"unknown ALOHA task {task!r}; choose one of {sorted(TASKS)}")
    gymnasium = check_simulator()
    try:
        # Creating the env loads the renderer, so a broken GL setup fails here.
        return gymnasium.make(f"gym_aloha/{task}", obs_type="pixels_agent_pos")
    except Exception as error:
        raise requirements.SetupError(rendering.renderer_hint(error)) from error


def observation(gym_obs: dict, prompt: str) -> dict:
    """gym-aloha observation -> the openpi ALOHA request."""
    image = image_tools.resize_with_pad(gym_obs["pixels"]["top"], 224, 224)
    return {
        "images": {"cam_high": np.ascontiguousarray(np.moveaxis(image, -1, 0))},
        "state": np.asarray(gym_obs["agent_pos"], np.float32),
        "prompt": prompt,
    }


def max_task_reward(env: Any) -> float:
    return float(env.unwrapped._env.task.max_reward)


def evaluate(
    policy: policies.EvalPolicy,
    settings: Settings,
    out_dir: pathlib.Path,
    info: dict,
    recorder: recording.EpisodeRecorder | None = None,
) -> dict:
    """Runs the episodes, rewriting `out_dir/results.json` after each; returns the final results."""
    env = make_env(settings.task)
    prompt = settings.prompt or TASKS[settings.task]
    chunker = chunking.ActionChunker(policy, settings.replan_steps, recorder)
    results: dict[str, Any] = {
        "env": "aloha",
        "task": settings.task,
        "prompt": prompt,
        "settings": dataclasses.asdict(settings),
        "policy": {**info, "metadata": dict(policy.metadata)},
        "episodes": [],
    }
    try:
        target = max_task_reward(env)
        for episode in console.progress(range(settings.episodes), "episodes"):
            record = _run_episode(env, chunker, settings, prompt, episode, target, out_dir)
            records.add_episode(results, record, _summary, out_dir)
            console.echo(
                f"episode {episode}: success={record['success']} max_reward={record['max_reward']} "
                f"steps={record['steps']} control {record['control_hz']:.1f} Hz"
            )
    finally:
        env.close()
    return results


def _run_episode(
    env: Any,
    chunker: chunking.ActionChunker,
    settings: Settings,
    prompt: str,
    episode: int,
    target: float,
    out_dir: pathlib.Path,
) -> dict:
    from dm_control.rl.control import PhysicsError  # gym-aloha's physics; present whenever `env` is

    seed = settings.seed + episode
    try:
        gym_obs, _ = env.reset(seed=seed)
    except Exception as error:
        raise requirements.SetupError(rendering.renderer_hint(error)) from error
    chunker.reset()
    frames, replans = [], []
    best, physics_error = 0.0, None
    meter = pacing.RateMeter()
    for step in console.progress(range(settings.max_steps), f"episode {episode}", leave=False):
        if settings.save_video:
            frames.append(gym_obs["pixels"]["top"])
        action, replan = chunker.act(step, lambda obs=gym_obs: observation(obs, prompt))
        chunking.keep_replan(replans, replan)
        try:
            gym_obs, reward, terminated, truncated, _ = env.step(np.asarray(action, np.float64))
        except PhysicsError as error:  # a policy's wild actions end its episode, not the evaluation
            physics_error = f"physics diverged at step {step}: {error}"
            console.echo(f"  {physics_error}")
            break
        meter.tick()
        best = max(best, float(reward))
        if best >= target or terminated or truncated:
            break
    chunker.end_episode()
    record = {"episode": episode, "seed": seed, "success": best >= target, "max_reward": best}
    record.update(records.episode_record(replans, meter))
    if physics_error is not None:
        record["physics_error"] = physics_error
    if settings.save_video:
        path = out_dir / "videos" / f"episode_{episode:03d}.mp4"
        record["video"] = str(video.write_video(path, frames, CONTROL_HZ).relative_to(out_dir))
    return record


def _summary(episodes: list[dict]) -> dict:
    successes = sum(e["success"] for e in episodes)
    return {
        "episodes": len(episodes),
        "successes": successes,
        "success_rate": successes / len(episodes),
        "mean_max_reward": float(np.mean([e["max_reward"] for e in episodes])),
        "control_hz": float(np.mean([e["control_hz"] for e in episodes])),
    }
