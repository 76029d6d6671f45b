"""ALOHA sim under simulated inference latency: the robot runs `client.Executor` (sync, naive or rtc) on
the simulated clock of `client.simulated`, against a local `Policy` served to it by a fresh `LocalRobot` per
episode, as the detour task's closed loop does. While a chunk is inferred the arms execute d control steps
of the old chunk (naive, rtc) or hold still (sync: the simulation is not stepped).

results.json has the detour task's fields (success_rate, mean_steps, switch_jump_mean, switch_jump_max,
jerk_mean, execution, delay_steps, action_horizon, episodes): jumps are max |new - old action| over the 14
joint targets at each change of chunk, the jerk is measured on the 14 joint positions.
"""

import dataclasses
import pathlib
from typing import Any

import numpy as np

from oxygen_jax.client import simulated
from oxygen_jax.evaluation import aloha_sim, console, records, video
from oxygen_jax.policies.policy import Policy
from oxygen_jax.robots import trial


class AlohaWorld:
    """One gym-aloha episode as the executor's robot: observes the env, steps it with each action, and is
    done at the task's maximum reward, the env's own end, or a physics error (wild actions)."""

    def __init__(self, env: Any, gym_obs: dict, prompt: str, target: float, save_video: bool):
        self._env, self._obs, self._prompt, self._target = env, gym_obs, prompt, target
        self.best = 0.0
        self.ended = False
        self.physics_error: str | None = None
        self.frames = [gym_obs["pixels"]["top"]] if save_video else None

    def observe(self) -> dict:
        return aloha_sim.observation(self._obs, self._prompt)

    def act(self, action: np.ndarray) -> None:
        from dm_control.rl.control import PhysicsError  # gym-aloha's physics; present whenever the env is

        try:
            self._obs, reward, terminated, truncated, _ = self._env.step(np.asarray(action, np.float64))
        except PhysicsError as error:  # a policy's wild actions end its episode, not the evaluation
            self.physics_error = str(error)
            return
        self.best = max(self.best, float(reward))
        self.ended = bool(terminated or truncated)
        if self.frames is not None:
            self.frames.append(self._obs["pixels"]["top"])

    def position(self) -> np.ndarray:
        return np.asarray(self._obs["agent_pos"], np.float64)

    @property
    def success(self) -> bool:
        return self.best >= self._target

    @property
    def done(self) -> bool:
        return self.success or self.ended or self.physics_error is not None


@dataclasses.dataclass(frozen=True)
class Episode:
    success: bool
    max_reward: float
    steps: int  # control ticks run, waits included
    jumps: list[float]
    jerk: float
    physics_error: str | None


def evaluate(
    policy: Policy,
    settings: aloha_sim.Settings,
    out_dir: pathlib.Path,
    info: dict,
    *,
    execution: str,
    delay_steps: int,
    execution_horizon: int,
    guidance: trial.GuidanceSettings = trial.DEFAULT_GUIDANCE,
) -> dict[str, Any]:
    """Runs the episodes, rewriting `out_dir/results.json` after each; returns the final results. Episode i
    resets the env with seed + i and draws the action noise from (seed, i), so every mode and delay see the
    same scenes and noise streams."""
    guidance.check(
        policy.engine.config, execution=execution, delays=[delay_steps], execution_horizon=execution_horizon
    )
    guidance = guidance.for_policy(policy)
    env = aloha_sim.make_env(settings.task)
    prompt = settings.prompt or aloha_sim.TASKS[settings.task]
    results: dict[str, Any] = {
        "env": "aloha",
        "task": settings.task,
        "prompt": prompt,
        "policy": {**info, "metadata": dict(policy.metadata)},
        "execution": execution,
        "delay_steps": delay_steps,
        "action_horizon": policy.engine.config.action_horizon,
        "execution_horizon": execution_horizon,
        "seed": settings.seed,
        "max_steps": settings.max_steps,
        **guidance.fields(),
    }
    episodes: list[Episode] = []
    try:
        target = aloha_sim.max_task_reward(env)
        for index in console.progress(range(settings.episodes), f"{execution} d={delay_steps}"):
            gym_obs, _ = env.reset(seed=settings.seed + index)
            world = AlohaWorld(env, gym_obs, prompt, target, settings.save_video)
            motion = simulated.run(
                world,
                trial.seeded_infer(policy, guidance, np.random.default_rng((settings.seed, index))),
                execution=execution,
                delay_steps=delay_steps,
                execution_horizon=execution_horizon,
                control_hz=aloha_sim.CONTROL_HZ,
                max_ticks=settings.max_steps,
                prefix_horizon=guidance.prefix_horizon,
            )
            episodes.append(
                Episode(
                    world.success, world.best, motion.ticks, motion.jumps, motion.jerk, world.physics_error
                )
            )
            if world.frames is not None:
                video.write_video(
                    out_dir / "videos" / f"episode_{index:03d}.mp4", world.frames, aloha_sim.CONTROL_HZ
                )
            records.write_json(out_dir / "results.json", {**results, **summarize(episodes)})
    finally:
        env.close()
    return {**results, **summarize(episodes)}


def summarize(episodes: list[Episode]) -> dict[str, Any]:
    successes = [e for e in episodes if e.success]
    return {
        "episodes": len(episodes),
        "success_rate": len(successes) / len(episodes),
        "mean_steps": float(np.mean([e.steps for e in successes])) if successes else None,
        "mean_max_reward": float(np.mean([e.max_reward for e in episodes])),
        "physics_errors": sum(e.physics_error is not None for e in episodes),
        **simulated.motion_summary(episodes),
        "episode_results": [
            {"success": e.success, "max_reward": e.max_reward, "steps": e.steps, "switches": len(e.jumps)}
            | ({"physics_error": e.physics_error} if e.physics_error else {})
            for e in episodes
        ],
    }
