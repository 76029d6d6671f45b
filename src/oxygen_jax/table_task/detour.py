"""The detour task: the gripper reaches a red cube behind a grey block, around either side of it.

Seen from above like the demo table: the gripper starts near the bottom edge, the cube stands near the top
and a block stands between them. A demonstration first moves straight up toward the block, then goes
around it on a side drawn at random (left or right with equal chance) and on to the cube, at a constant
speed of `SPEED` per control step, ~25 steps in all: several action chunks of 10, and two valid motions,
so two chunks sampled near the block can disagree. The robot's actions are gripper positions (x, y in
[0, 1]); the world moves the gripper toward each at most `MAX_MOVE` per step, and a gripper whose centre
enters the block has collided (the demonstrations keep at least 0.05 from it).
"""

import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np

from oxygen_jax.table_task import scenes as table_scenes

PROMPT = "reach the red cube around the block"
SIDES = ("left", "right")
_SIGNS = {"left": -1.0, "right": 1.0}  # which way each side is along x
SPEED = 0.04  # table units per control step in the demonstrations
MAX_MOVE = 0.08  # the most the gripper moves in one step toward its commanded position
SUCCESS_RADIUS = 0.05  # the reach succeeds when the gripper's centre is this close to the cube's
HOLD_STEPS = 3  # frames at the cube that end each demonstration
BLOCK_HALF = np.array([0.12, 0.07], np.float32)
_BLOCK_Y = 0.52
SPLIT_Y = 0.78  # where the demonstrations leave the straight line toward the block
_SIDE_OFFSET = 0.32  # x distance of the waypoint beside the block from the block's centre
_START_Y = 0.9
_GREY = (110, 110, 110)
_DARK = (30, 30, 30)
GRIPPER_RADIUS = 0.07
_RED = table_scenes.COLOURS["red"]
# Seeds of the scene streams: held-out scenes never appear in training data.
TRAIN_SEED = 0
HELD_OUT_SEED = 2_000_003


@dataclasses.dataclass(frozen=True)
class DetourScene:
    start: np.ndarray  # [2] gripper start
    block: np.ndarray  # [2] centre of the block
    goal: np.ndarray  # [2] centre of the cube

    def waypoints(self, side: str) -> np.ndarray:
        """[4, 2] the demonstration's corners: start, the split point, beside the block, the cube."""
        split = (self.start[0], SPLIT_Y)
        beside = (self.block[0] + _SIGNS[side] * _SIDE_OFFSET, self.block[1])
        return np.array([self.start, split, beside, self.goal], np.float32)

    def path(self, side: str) -> np.ndarray:
        """[n + 1, 2] a demonstration's gripper positions: along the waypoints at `SPEED` per step, ending
        on the cube."""
        return _along(self.waypoints(side))

    def recovery_path(self, side: str, turn_y: float) -> np.ndarray:
        """[n + 1, 2] a recovery from overshooting: straight on past the split point down to `turn_y`,
        sideways there to beside the block, then down beside it and on to the cube, at `SPEED` per step."""
        return _along(self.recovery_waypoints(side, turn_y))

    def recovery_waypoints(self, side: str, turn_y: float) -> np.ndarray:
        """[5, 2] a recovery's corners: start, the turn, beside the block at the turn, beside it, the cube."""
        beside_x = float(self.block[0]) + _SIGNS[side] * _SIDE_OFFSET
        corners = [
            self.start,
            (self.start[0], turn_y),
            (beside_x, turn_y),
            (beside_x, self.block[1]),
            self.goal,
        ]
        return np.array(corners, np.float32)

    def collides(self, a: np.ndarray, b: np.ndarray) -> bool:
        """Whether the straight move from a to b passes through the block."""
        low, high = self.block - BLOCK_HALF, self.block + BLOCK_HALF
        # Slab test of the segment a + t (b - a), t in [0, 1], against the box [low, high].
        delta = np.asarray(b, np.float64) - np.asarray(a, np.float64)
        t_in, t_out = 0.0, 1.0
        for axis in range(2):
            if abs(delta[axis]) < 1e-12:
                if not low[axis] <= a[axis] <= high[axis]:
                    return False
                continue
            t0, t1 = sorted(((low[axis] - a[axis]) / delta[axis], (high[axis] - a[axis]) / delta[axis]))
            t_in, t_out = max(t_in, t0), min(t_out, t1)
        return t_in <= t_out

    def reached(self, gripper: np.ndarray) -> bool:
        return float(np.linalg.norm(np.asarray(gripper) - self.goal)) <= SUCCESS_RADIUS

    def observation(self, gripper: np.ndarray) -> dict:
        """What the table robot sends its policy (`policies.table`)."""
        gripper = np.asarray(gripper, np.float32)
        return {"observation/image": render(self, gripper), "observation/state": gripper, "prompt": PROMPT}


def _along(corners: np.ndarray) -> np.ndarray:
    """[n + 1, 2] positions along the polyline `corners`, `SPEED` apart, the last one on its end."""
    lengths = np.linalg.norm(np.diff(corners, axis=0), axis=1)
    along = np.concatenate([[0.0], np.cumsum(lengths)])
    steps = int(np.ceil(along[-1] / SPEED - 1e-6))
    distance = np.minimum(np.arange(steps + 1) * SPEED, along[-1])
    xy = [np.interp(distance, along, corners[:, axis]) for axis in range(2)]
    return np.stack(xy, axis=1).astype(np.float32)


def random_scene(rng: np.random.Generator) -> DetourScene:
    start = (0.5 + rng.uniform(-0.03, 0.03), _START_Y)
    block = (0.5 + rng.uniform(-0.03, 0.03), _BLOCK_Y)
    goal = (0.5 + rng.uniform(-0.05, 0.05), rng.uniform(0.14, 0.2))
    return DetourScene(*(np.array(p, np.float32) for p in (start, block, goal)))


def scenes(seed: int) -> Iterator[DetourScene]:
    """An endless reproducible stream of scenes (train and held-out sets use different seeds)."""
    rng = np.random.default_rng(seed)
    while True:
        yield random_scene(rng)


def render(
    scene: DetourScene, gripper: np.ndarray, under: Sequence[tuple[np.ndarray, tuple[int, int, int]]] = ()
) -> np.ndarray:
    """uint8 [224, 224, 3]: the table, the grey block, the red cube and the gripper as a dark disc (filled
    and wider than the demo's ring, so that the patches it covers tell its position finely). under: more
    cube-sized squares (centre, colour) drawn beneath the cube (the moving task's trail)."""
    size = table_scenes.IMAGE_SIZE
    image = np.broadcast_to(table_scenes.TABLE_RGB, (size, size, 3)).copy()
    grid = (np.arange(size) + 0.5) / size
    for centre, half, colour in (
        (scene.block, BLOCK_HALF, _GREY),
        *(((centre, (table_scenes.CUBE_HALF,) * 2, colour) for centre, colour in under)),
        (scene.goal, (table_scenes.CUBE_HALF,) * 2, _RED),
    ):
        rows = np.abs(grid - centre[1]) <= half[1]
        columns = np.abs(grid - centre[0]) <= half[0]
        image[np.ix_(rows, columns)] = colour
    distance = np.hypot(grid[None, :] - gripper[0], grid[:, None] - gripper[1])
    image[distance <= GRIPPER_RADIUS] = _DARK
    return image
