"""The detour task in closed loop under simulated inference latency: a trained policy drives the gripper
through the robot-side `client.Executor` in one of its modes (sync, naive, rtc).

Time is simulated, so results do not depend on the machine's speed: the policy computes while the clock
stands still, and its reply reaches the robot `delay_steps` control steps after the observation was taken.
Meanwhile the world advances with the old chunk (naive, rtc) or the robot waits (sync). One episode ends
when the gripper reaches the cube, enters the block or runs out of `max_steps` control steps.
"""

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import tqdm

from oxygen_jax.client import Executor, ExecutorConfig, SimClock
from oxygen_jax.policies.policy import Policy, create_policy
from oxygen_jax.policies.rtc import RtcPolicy
from oxygen_jax.table_task import dataset, detour

CONTROL_HZ = float(dataset.FPS)  # the demonstrations' rate
MAX_STEPS = 120  # control steps per episode: ~5x a demonstration's length


@dataclasses.dataclass(frozen=True)
class _Delivered:
    clock: SimClock
    ready_at: float
    reply: Mapping[str, Any]

    def done(self) -> bool:
        return self.clock.now() >= self.ready_at - 1e-9

    def result(self) -> Mapping[str, Any]:
        return self.reply


class DelayedRequests:
    """Answers each observation at once (the clock stands still) and hands the reply to the robot at the
    control tick after `delay_steps` more actions: the observation is taken after tick k's action, the
    reply is there at tick k + 1 + delay_steps."""

    def __init__(self, infer: Callable[[dict], Mapping[str, Any]], clock: SimClock, delay_steps: int):
        self._infer, self._clock = infer, clock
        self._latency_s = (delay_steps + 1) / CONTROL_HZ

    def submit(self, obs: dict) -> _Delivered:
        return _Delivered(self._clock, self._clock.now() + self._latency_s, self._infer(obs))


class DetourWorld:
    """The robot of one detour scene: it sends the scene's observation and moves the gripper toward each
    commanded position, at most `detour.MAX_MOVE` per step; a move into the block stops it (collided)."""

    def __init__(self, scene: detour.DetourScene):
        self.scene = scene
        self.gripper = scene.start.copy()
        self.collided = False
        self.positions = [self.gripper.copy()]

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

    def record(self) -> None:
        """Keeps this control step's gripper position (one per step, waits included)."""
        self.positions.append(self.gripper.copy())

    @property
    def done(self) -> bool:
        return self.collided or self.scene.reached(self.gripper)


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
    scene: detour.DetourScene,
    *,
    execution: str,
    delay_steps: int,
    execution_horizon: int,
    max_steps: int = MAX_STEPS,
) -> Episode:
    """One episode of `infer` (a fresh `RtcPolicy.infer` per episode: it keeps the robot's last chunk)."""
    clock = SimClock()
    world = DetourWorld(scene)
    config = ExecutorConfig(
        control_hz=CONTROL_HZ, execution_horizon=execution_horizon, mode=execution, delay_steps=delay_steps
    )
    executor = Executor(config, world, requests=DelayedRequests(infer, clock, delay_steps), clock=clock)
    while executor.stats.ticks < max_steps and not world.done:
        executor.tick()
        world.record()
    positions = np.stack(world.positions)
    jerk = np.linalg.norm(np.diff(positions, n=3, axis=0), axis=1)
    return Episode(
        success=scene.reached(world.gripper) and not world.collided,
        collided=world.collided,
        steps=executor.stats.ticks,
        jumps=[s.jump for s in executor.stats.switches if s.jump is not None],
        jerk=float(jerk.mean()) if jerk.size else 0.0,
        side=_side(scene, positions),
    )


def _side(scene: detour.DetourScene, positions: np.ndarray) -> str:
    beside = positions[np.abs(positions[:, 1] - scene.block[1]) <= detour.BLOCK_HALF[1]]
    if not len(beside):
        return "none"
    return "left" if beside[:, 0].mean() < scene.block[0] else "right"


def summarize(episodes: list[Episode]) -> dict[str, Any]:
    """The figures of a run: success rate, control steps to success, chunk-switch jumps and jerk."""
    successes = [e for e in episodes if e.success]
    jumps = [j for e in episodes for j in e.jumps]
    return {
        "success_rate": len(successes) / len(episodes),
        "collision_rate": sum(e.collided for e in episodes) / len(episodes),
        "mean_steps": float(np.mean([e.steps for e in successes])) if successes else None,
        "switch_jump_mean": float(np.mean(jumps)) if jumps else None,
        "switch_jump_max": float(np.max(jumps)) if jumps else None,
        "switches": len(jumps),
        "jerk_mean": float(np.mean([e.jerk for e in episodes])),
        "left_share": sum(e.side == "left" for e in episodes) / len(episodes),
    }


def evaluate(
    policy: Policy,
    *,
    execution: str,
    delay_steps: int,
    episodes: int,
    seed: int,
    execution_horizon: int,
    max_steps: int = MAX_STEPS,
) -> dict[str, Any]:
    """`episodes` held-out scenes in closed loop; results.json's fields. The same seed gives every mode
    and delay the same scenes and the same action noise, request by request."""
    horizon = policy.engine.config.action_horizon
    if not 0 <= delay_steps < horizon:
        raise ValueError(f"delay_steps must lie in [0, {horizon - 1}], got {delay_steps}")
    if execution != "sync" and delay_steps > execution_horizon:
        raise ValueError(
            f"delay_steps {delay_steps} exceeds execution_horizon {execution_horizon}: the chunk runs out"
        )
    stream = detour.scenes(detour.HELD_OUT_SEED + seed)
    shape = (horizon, policy.engine.config.action_dim)
    runs = []
    for index in tqdm.trange(episodes, desc=f"{execution} d={delay_steps}", unit="episode"):
        runs.append(
            run_episode(
                _noisy_infer(RtcPolicy(policy), np.random.default_rng((seed, index)), shape),
                next(stream),
                execution=execution,
                delay_steps=delay_steps,
                execution_horizon=execution_horizon,
                max_steps=max_steps,
            )
        )
    return {
        "execution": execution,
        "delay_steps": delay_steps,
        "action_horizon": horizon,
        "execution_horizon": execution_horizon,
        "episodes": episodes,
        "seed": seed,
        "max_steps": max_steps,
        **summarize(runs),
    }


def _noisy_infer(
    rtc: RtcPolicy, rng: np.random.Generator, shape: tuple[int, int]
) -> Callable[[dict], Mapping[str, Any]]:
    """`rtc.infer` with the action noise [H, action_dim] drawn from `rng`, one draw per request."""
    return lambda obs: rtc.infer(obs, noise=rng.standard_normal(shape).astype(np.float32))


def default_execution_horizon(horizon: int) -> int:
    """H/2 + 1 actions left when the next chunk is asked for, in every mode: up to d = H/2 the old chunk
    still has an action for the step the new chunk starts at, so naive's and rtc's jumps are measured."""
    return horizon // 2 + 1


def load_policy(config_name: str, checkpoint_dir: str | None) -> Policy:
    """The policy the closed loop drives: float32 params, actions only."""
    return create_policy(config_name, checkpoint_dir, params_dtype="float32", max_text_tokens=0)


def delay_from_latency(latency_ms: float) -> int:
    """Control steps a reply of `latency_ms` takes, rounded up: the d the world advances meanwhile."""
    return math.ceil(latency_ms * CONTROL_HZ / 1000 - 1e-6)
