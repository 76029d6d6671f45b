"""Where a robot that runs real-time chunking goes on the moving detour task, as training episodes.

A model trained with a clean prefix learns from demonstrations, in which the given actions and the frame
always agree. A robot's given actions come from a chunk computed 5-10 steps before: on the moving task
they often head where the cube was, and the model, which has only seen them agree with the frame,
continues them. `collect` runs rtc with a policy on training scenes (d drawn from `DELAYS`, every other
episode's latencies jittered as `--latency_jitter=uniform`); `stale_episodes` turns each request the robot
made below the block into an episode: from that request's frame, the stale actions the robot executed
while it waited, then the demonstrator's pursuit from where they left the gripper, making up the lost
steps at the robot's top speed (`MovingDetourScene.pursuit_from`). Each frame's least clean prefix is the
number of stale actions left in its chunk, so training gives them and never teaches them
(`training/loss.py`); the frames after them teach the pursuit from the states the robot reaches (DAgger).
"""

import dataclasses
from collections.abc import Iterator

import numpy as np
import tqdm

from oxygen_jax.client import latency, simulated
from oxygen_jax.client.executor import SimClock
from oxygen_jax.evaluation import closed_loop
from oxygen_jax.policies.policy import Policy
from oxygen_jax.robots import trial
from oxygen_jax.table_task import detour_dataset, moving_detour

DELAYS = (2, 3, 4, 5, 5)  # the d of each episode, drawn uniformly: H/2 twice as often as the others
# Requests from a gripper this far down (past the block's far edge, y 0.45) become episodes: nothing stands
# between it and the cube, so the pursuit needs no way around.
BELOW_BLOCK_Y = 0.45
# The rollouts' scenes: a stream of their own (seed ROLLOUT_SEED + seed), neither the demonstrations' nor
# the held-out ones.
ROLLOUT_SEED = 4_000_037


@dataclasses.dataclass(frozen=True)
class Rollout:
    scene: moving_detour.MovingDetourScene
    delay: int  # the d the robot sent: the stale actions it executes per request
    requests: tuple[int, ...]  # the control steps at which it asked for a chunk
    positions: np.ndarray  # [ticks + 1, 2] the gripper after each control step


class _LoggedWorld(closed_loop.MovingDetourWorld):
    """The moving task's robot, noting the control step of each observation it sends (each request)."""

    def __init__(self, scene: moving_detour.MovingDetourScene, clock: SimClock):
        super().__init__(scene, clock)
        self.requests: list[int] = []

    def observe(self) -> dict:
        self.requests.append(round(self.step))
        return super().observe()


def collect(policy: Policy, num_episodes: int, seed: int) -> list[Rollout]:
    """`num_episodes` rtc episodes of `policy` (the tools' defaults otherwise) on the rollout scenes."""
    guidance = trial.DEFAULT_GUIDANCE.for_policy(policy)
    horizon = policy.engine.config.action_horizon
    scenes = moving_detour.scenes(ROLLOUT_SEED + seed)
    rng = np.random.default_rng(seed)
    rollouts = []
    for index in tqdm.trange(num_episodes, desc="rtc rollouts", unit="episode"):
        scene, delay = next(scenes), int(rng.choice(DELAYS))
        jitter = latency.LatencySettings(jitter="uniform" if index % 2 else "none")
        clock = SimClock()
        world = _LoggedWorld(scene, clock)
        motion = simulated.run(
            world,
            trial.seeded_infer(policy, guidance, np.random.default_rng((seed, index))),
            execution="rtc",
            delay_steps=delay,
            execution_horizon=simulated.default_execution_horizon(horizon),
            control_hz=closed_loop.CONTROL_HZ,
            max_ticks=moving_detour.MAX_STEPS,
            latency_steps=jitter.drawer(delay, np.random.default_rng((seed, index, 1))),
            clock=clock,
        )
        rollouts.append(Rollout(scene, delay, tuple(world.requests), motion.positions))
    return rollouts


def stale_episodes(rollout: Rollout) -> Iterator[detour_dataset.StaleEpisode]:
    """An episode (its scene, positions [n + 1, 2], the control step of the first, the stale actions they
    start with) for each request below the block that continued a chunk and whose stale actions all
    ran."""
    positions, stale = rollout.positions, rollout.delay
    for step in rollout.requests[1:]:
        if positions[step][1] >= BELOW_BLOCK_Y or step + stale >= len(positions):
            continue
        executed = positions[step : step + stale + 1]
        after = rollout.scene.pursuit_from(executed[-1], step + stale, fast_steps=stale)
        yield rollout.scene, np.concatenate([executed, after[1:]]), step, stale
