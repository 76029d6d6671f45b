"""The detour task in closed loop under simulated inference latency: a trained policy drives the gripper
through the robot-side `client.Executor` in one of its modes (sync, naive, rtc; bid: as rtc, each chunk
chosen by bidirectional decoding), on the simulated clock of `client.simulated`, each request's latency
fixed or drawn (`client.latency`). One episode ends when the gripper reaches the cube, enters the block
or runs out of `max_steps` control steps. The moving detour task (`moving_detour`) runs the same way, its
cube moving with the simulated clock: on every control step, those the robot waits included.
"""

import collections
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import tqdm

from oxygen_jax.client import latency, simulated
from oxygen_jax.client.executor import SimClock
from oxygen_jax.policies import rtc_defaults
from oxygen_jax.policies.policy import Policy, create_policy
from oxygen_jax.robots import bid_robot, trial
from oxygen_jax.table_task import dataset, detour, moving_detour

CONTROL_HZ = float(dataset.FPS)  # the demonstrations' rate
MAX_STEPS = 120  # control steps per episode: ~5x a demonstration's length
TASKS = ("detour", "detour_moving")  # the tasks `evaluate` runs (a config's `table_task`)
_LATENCY_STREAM = 1  # the latency draws' seed is (seed, episode, this)


class DetourWorld:
    """The robot of one detour scene: it sends the scene's observation and moves the gripper toward each
    commanded position, at most `detour.MAX_MOVE` per step; a move into the block stops it (collided)."""

    def __init__(self, scene: detour.DetourScene):
        self.scene = scene
        self.gripper = scene.start.copy()
        self.collided = False

    def observe(self) -> dict:
        return self.scene.observation(self.gripper)

    def act(self, action: np.ndarray) -> None:
        if self.collided:
            return
        move = np.asarray(action, np.float32)[:2] - self.gripper
        length = float(np.linalg.norm(move))
        if length > detour.MAX_MOVE:
            move *= detour.MAX_MOVE / length
        target = self.gripper + move
        if self.scene.collides(self.gripper, target):
            self.collided = True
            return
        self.gripper = target.astype(np.float32)

    def position(self) -> np.ndarray:
        return self.gripper.copy()

    @property
    def done(self) -> bool:
        return self.collided or self.scene.reached(self.gripper)


class MovingDetourWorld(DetourWorld):
    """The robot of one moving detour scene: as `DetourWorld`, the cube where `clock` says it is (the
    scene `step` control steps into the episode)."""

    def __init__(self, scene: moving_detour.MovingDetourScene, clock: SimClock):
        self.moving, self._clock = scene, clock
        self.gripper = scene.still.start.copy()
        self.collided = False

    @property
    def step(self) -> float:
        return self._clock.now() * CONTROL_HZ

    @property
    def scene(self) -> detour.DetourScene:
        return self.moving.at(self.step)

    def observe(self) -> dict:
        return self.moving.observation(self.gripper, self.step)


@dataclasses.dataclass(frozen=True)
class Episode:
    success: bool
    collided: bool
    steps: int  # control steps run (to success, when it succeeded)
    jumps: list[float]  # per change of chunk while the old chunk still had an action for that step
    jerk: float  # mean |third difference| of the gripper's positions over the episode's steps
    side: str  # the side of the block the gripper passed ("none" if it never got beside the block)


def run_episode(
    infer: Callable[[dict], Mapping[str, Any]],
    scene: detour.DetourScene | moving_detour.MovingDetourScene,
    *,
    execution: str,
    delay_steps: int,
    execution_horizon: int,
    max_steps: int = MAX_STEPS,
    prefix_horizon: int | None = None,
    latency_steps: Callable[[Mapping[str, Any]], float] | None = None,
    delay_estimate: int | None = None,
) -> Episode:
    """One episode of `infer` (a fresh `LocalRobot.infer` per episode: it keeps the robot's last chunk);
    latency_steps and delay_estimate as in `simulated.run`."""
    clock = SimClock()
    if isinstance(scene, moving_detour.MovingDetourScene):
        world = MovingDetourWorld(scene, clock)
    else:
        world = DetourWorld(scene)
    motion = simulated.run(
        world,
        infer,
        execution=execution,
        delay_steps=delay_steps,
        execution_horizon=execution_horizon,
        control_hz=CONTROL_HZ,
        max_ticks=max_steps,
        prefix_horizon=prefix_horizon,
        latency_steps=latency_steps,
        delay_estimate=delay_estimate,
        clock=clock,
    )
    return episode(world, motion)


def episode(world: DetourWorld, motion: simulated.Motion) -> Episode:
    """The figures of one episode the robot `world` ran with `motion` (simulated or served)."""
    scene = world.scene
    return Episode(
        success=scene.reached(world.gripper) and not world.collided,
        collided=world.collided,
        steps=motion.ticks,
        jumps=motion.jumps,
        jerk=motion.jerk,
        side=_side(scene, motion.positions),
    )


def _side(scene: detour.DetourScene, positions: np.ndarray) -> str:
    beside = positions[np.abs(positions[:, 1] - scene.block[1]) <= detour.BLOCK_HALF[1]]
    if not len(beside):
        return "none"
    return "left" if beside[:, 0].mean() < scene.block[0] else "right"


def summarize(episodes: list[Episode]) -> dict[str, Any]:
    """The figures of a run: success rate, control steps to success (mean and spread), chunk-switch jumps
    and jerk; the steps at which episodes succeeded and collided, so that `success_within` reads the
    success rate at any smaller step budget from the same run."""
    successes = [e for e in episodes if e.success]
    return {
        "success_rate": len(successes) / len(episodes),
        "collision_rate": sum(e.collided for e in episodes) / len(episodes),
        "mean_steps": float(np.mean([e.steps for e in successes])) if successes else None,
        "steps_std": float(np.std([e.steps for e in successes])) if successes else None,
        **simulated.motion_summary(episodes),
        "left_share": sum(e.side == "left" for e in episodes) / len(episodes),
        "success_steps_histogram": _histogram(e.steps for e in successes),
        "collision_steps_histogram": _histogram(e.steps for e in episodes if e.collided),
    }


def _histogram(steps: Iterable[int]) -> dict[str, int]:
    """{steps: episodes}, keys in increasing order (JSON keys are strings)."""
    counts = collections.Counter(steps)
    return {str(step): counts[step] for step in sorted(counts)}


def success_within(results: Mapping[str, Any], budget: int) -> float:
    """The success rate the run `results` (results.json's fields) would have had with `budget` control
    steps per episode: an episode stops at success or collision and nothing else depends on the budget,
    so a run with a larger budget holds every smaller one's episodes, cut short."""
    if not 0 <= budget <= results["max_steps"]:
        raise ValueError(f"budget must lie in [0, {results['max_steps']}] (the run's budget), got {budget}")
    histogram = results["success_steps_histogram"]
    return sum(count for steps, count in histogram.items() if int(steps) <= budget) / results["episodes"]


def evaluate(
    policy: Policy,
    *,
    execution: str,
    delay_steps: int,
    episodes: int,
    seed: int,
    execution_horizon: int,
    max_steps: int | None = None,
    guidance: trial.GuidanceSettings = trial.DEFAULT_GUIDANCE,
    latencies: latency.LatencySettings = latency.NO_JITTER,
    task: str = "detour",
) -> dict[str, Any]:
    """`episodes` held-out scenes of `task` (one of `TASKS`) in closed loop; results.json's fields.
    max_steps: the task's budget by default. The same seed gives every mode and delay the same scenes,
    the same action noise, request by request, and the same latency draws (their own stream, so a run
    without jitter draws the noise it drew before)."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    moving = task == "detour_moving"
    if max_steps is None:
        max_steps = moving_detour.MAX_STEPS if moving else MAX_STEPS
    guidance.check(
        policy.engine.config, execution=execution, delays=[delay_steps], execution_horizon=execution_horizon
    )
    latencies.check(policy.engine.config.action_horizon)
    guidance = guidance.for_policy(policy)
    seeded_infer = bid_robot.seeded_infer if execution == "bid" else trial.seeded_infer
    module = moving_detour if moving else detour
    stream = module.scenes(module.HELD_OUT_SEED + seed)
    runs = []
    for index in tqdm.trange(episodes, desc=f"{execution} d={delay_steps}", unit="episode"):
        latency_rng = np.random.default_rng((seed, index, _LATENCY_STREAM))
        runs.append(
            run_episode(
                seeded_infer(policy, guidance, np.random.default_rng((seed, index))),
                next(stream),
                execution=execution,
                delay_steps=delay_steps,
                execution_horizon=execution_horizon,
                max_steps=max_steps,
                prefix_horizon=guidance.prefix_horizon,
                latency_steps=latencies.drawer(delay_steps, latency_rng),
                delay_estimate=latencies.delay_estimate,
            )
        )
    return {
        "config": policy.metadata["config"],
        "task": task,
        "execution": execution,
        "delay_steps": delay_steps,
        "action_horizon": policy.engine.config.action_horizon,
        "execution_horizon": execution_horizon,
        "episodes": episodes,
        "seed": seed,
        "max_steps": max_steps,
        # How rtc keeps the executed actions: guidance, or a model trained with a clean prefix (None: bid,
        # which chooses among plain samples instead).
        "rtc_method": None
        if execution == "bid"
        else rtc_defaults.method(policy.engine.config.max_clean_prefix),
        **guidance.fields(),
        **latencies.fields(),
        **({"bid_weak_steps": bid_robot.default_weak_steps(policy.num_steps)} if execution == "bid" else {}),
        **summarize(runs),
    }


def load_policy(config_name: str, checkpoint_dir: str | None) -> Policy:
    """The policy the closed loop drives: float32 params, actions only."""
    return create_policy(config_name, checkpoint_dir, params_dtype="float32", max_text_tokens=0)


def delay_from_latency(latency_ms: float) -> int:
    """Control steps a reply of `latency_ms` takes at the detour task's rate, rounded up."""
    return simulated.delay_from_latency(latency_ms, CONTROL_HZ)
