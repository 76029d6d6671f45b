"""The moving detour task: the detour task (`detour`) with a cube that slides sideways behind the block.

The cube moves along x at a constant speed drawn per scene (below the gripper's `detour.SPEED`), bouncing
off the edges of its lane, every control step whether or not the robot acts: a robot that stands still
while a chunk is computed falls behind it. The image shows the cube where it is now over a pale trail of
where it was `TRAIL_STEPS` ago, so one frame tells which way and how fast it goes. A demonstration goes
up and around the block on a random side as in the detour task, then pursues the cube: each step
`detour.SPEED` toward where the cube is when that step ends, landing on it once it is that close. An
episode succeeds when the gripper comes within `detour.SUCCESS_RADIUS` of the cube's current position
within `MAX_STEPS` control steps.
"""

import dataclasses
from collections.abc import Iterator

import numpy as np

from oxygen_jax.table_task import detour

SPEED_RANGE = (0.01, 0.02)  # the cube's speed along x, table units per control step
LANE = (0.12, 0.88)  # the x range the cube's centre bounces between
TRAIL_STEPS = 3  # how far back the pale trail shows the cube
# Control steps per episode: a demonstration takes 22 to 35; standing still 5 of every 9 steps (sync at
# d = 5 with H = 10) misses most cubes within it.
MAX_STEPS = 42
# The held-out scenes' seed (training data uses `detour.TRAIN_SEED`'s stream).
HELD_OUT_SEED = 3_000_017
_PALE_RED = (225, 150, 140)


@dataclasses.dataclass(frozen=True)
class MovingDetourScene:
    still: detour.DetourScene  # the scene at step 0
    velocity: float  # the cube's signed speed along x at step 0, table units per control step

    def goal_at(self, step: float) -> np.ndarray:
        """[2] the cube's centre `step` control steps into the episode (bouncing inside `LANE`)."""
        low, high = LANE
        width = high - low
        travelled = (float(self.still.goal[0]) - low + self.velocity * step) % (2 * width)
        x = low + (travelled if travelled <= width else 2 * width - travelled)
        return np.array([x, self.still.goal[1]], np.float32)

    def at(self, step: float) -> detour.DetourScene:
        """The scene as it stands `step` control steps into the episode."""
        return dataclasses.replace(self.still, goal=self.goal_at(step))

    def observation(self, gripper: np.ndarray, step: float) -> dict:
        """What the table robot sends its policy at `step`: the detour task's, the trail drawn in."""
        gripper = np.asarray(gripper, np.float32)
        trail = self.goal_at(step - TRAIL_STEPS)
        image = detour.render(self.at(step), gripper, under=[(trail, _PALE_RED)])
        return {"observation/image": image, "observation/state": gripper, "prompt": detour.PROMPT}

    def path(self, side: str, stalls: frozenset[int] = frozenset(), max_steps: int = 200) -> np.ndarray:
        """[n + 1, 2] a demonstration's gripper positions, the last one on the cube (at step n). stalls: the
        steps at which the gripper stands still instead (a robot waiting for its next chunk); the path
        then ends after `max_steps` if it has not caught the cube."""
        return self._pursuit(self.still.waypoints(side), stalls, max_steps)

    def recovery_path(self, side: str, turn_y: float) -> np.ndarray:
        """[n + 1, 2] `detour.DetourScene.recovery_path`'s corners, then the pursuit of the cube."""
        return self._pursuit(self.still.recovery_waypoints(side, turn_y))

    def pursuit_from(
        self, gripper: np.ndarray, step: int, fast_steps: int = 0, max_steps: int = 200
    ) -> np.ndarray:
        """[n + 1, 2] the demonstrator's pursuit from `gripper` at `step` (a gripper below the block, where
        nothing stands between it and the cube), the first `fast_steps` at `detour.MAX_MOVE`: a robot that
        lost steps makes them up at its top speed."""
        return self._pursuit([gripper], step=step, fast_steps=fast_steps, max_steps=max_steps)

    def _pursuit(
        self,
        corners: list[np.ndarray] | np.ndarray,
        stalls: frozenset[int] = frozenset(),
        max_steps: int = 200,
        step: int = 0,
        fast_steps: int = 0,
    ) -> np.ndarray:
        """From `corners[0]` at `step`, along the other corners (the last of more than one, the cube at
        step 0, is left out) at `detour.SPEED` per step (the first `fast_steps` at `detour.MAX_MOVE`;
        none at the `stalls`, counted from `step`), then after the cube wherever it is when each step
        ends."""
        ahead = list(corners[1:-1])
        positions = [np.asarray(corners[0], np.float32)]
        for k in range(max_steps):
            gripper, goal = positions[-1], self.goal_at(step + k + 1)
            if k not in stalls:
                speed = detour.MAX_MOVE if k < fast_steps else detour.SPEED
                gripper, reached = _pursue(gripper, [*ahead, goal], speed)
                ahead = ahead[reached:]
            positions.append(gripper)
            if np.array_equal(gripper, goal):
                break
        return np.stack(positions)


def _pursue(
    gripper: np.ndarray, targets: list[np.ndarray], speed: float = detour.SPEED
) -> tuple[np.ndarray, int]:
    """One step of `speed` along `targets` in turn, carrying what is left over past a reached one; the new
    position and how many targets it reached."""
    budget = speed
    for reached, target in enumerate(targets):
        move = target - gripper
        length = float(np.linalg.norm(move))
        if length > budget + 1e-9:
            return (gripper + move * (budget / length)).astype(np.float32), reached
        gripper, budget = np.asarray(target, np.float32), budget - length
    return gripper, len(targets)


def random_scene(rng: np.random.Generator) -> MovingDetourScene:
    speed = rng.uniform(*SPEED_RANGE) * rng.choice([-1.0, 1.0])
    return MovingDetourScene(detour.random_scene(rng), float(speed))


def scenes(seed: int) -> Iterator[MovingDetourScene]:
    """An endless reproducible stream of scenes (train and held-out sets use different seeds)."""
    rng = np.random.default_rng(seed)
    while True:
        yield random_scene(rng)
