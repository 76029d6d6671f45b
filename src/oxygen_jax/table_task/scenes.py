"""The demo table task: coloured cubes on a table seen from above, a prompt naming one, a gripper reaching it.

A scene holds three cubes of different colours in three slots (left, middle, right). The prompt names one
cube by its place ("pick up the cube on the left"); the true subtask names its colour too ("reach the red
cube on the left"), which only the image tells; the actions are the gripper's next positions on a straight
line from where it is toward the cube, `STEPS` moves from the start to the cube. Everything is rendered
here with numpy, so the demo model's sentences and actions can be checked against the truth.
"""

import dataclasses
from collections.abc import Iterator

import numpy as np

IMAGE_SIZE = 224
COLOURS = {
    "red": (215, 40, 40),
    "green": (40, 165, 60),
    "blue": (45, 85, 215),
    "yellow": (235, 205, 40),
}
# Slot -> (x of its centre, the words the subtask uses). The left and right cubes stay inside the outer
# quarters of the image and the middle cube inside the inner half, whatever their jitter.
SLOTS = {"left": (0.125, "on the left"), "middle": (0.5, "in the middle"), "right": (0.875, "on the right")}
_X_JITTER = 0.03
GRIPPER_START = np.array([0.5, 0.85], np.float32)
# Moves of the gripper from its start to the cube; an episode shows every position on the way.
STEPS = 5
# Seeds of the scene streams: held-out scenes never appear in training data.
TRAIN_SEED = 0
HELD_OUT_SEED = 1_000_003
TABLE_RGB = np.array([196, 164, 118], np.uint8)
CUBE_HALF = 0.07
_GRIPPER_RADIUS = 0.05


@dataclasses.dataclass(frozen=True)
class Scene:
    colours: tuple[str, str, str]  # colour in the left, middle and right slot
    positions: np.ndarray  # [3, 2] cube centres (x right, y down, in [0, 1])
    target: int  # slot of the cube the prompt names

    @property
    def place(self) -> str:
        """Where the target cube is, in words ("on the left")."""
        return list(SLOTS.values())[self.target][1]

    @property
    def prompt(self) -> str:
        return f"pick up the cube {self.place}"

    @property
    def subtask(self) -> str:
        return f"reach the {self.colours[self.target]} cube {self.place}"

    @property
    def goal(self) -> np.ndarray:
        return self.positions[self.target]

    def gripper(self, step: int) -> np.ndarray:
        """Gripper position after `step` moves (at the cube from `STEPS` on)."""
        fraction = min(step, STEPS) / STEPS
        return (GRIPPER_START + fraction * (self.goal - GRIPPER_START)).astype(np.float32)

    def action_chunk(self, step: int, horizon: int) -> np.ndarray:
        """The true actions [horizon, 2] at `step`: the gripper's next `horizon` positions."""
        return np.stack([self.gripper(step + k) for k in range(1, horizon + 1)])

    def observation(self, step: int = 0) -> dict:
        """What the table robot sends its policy (`policies.table`)."""
        return {
            "observation/image": render(self, self.gripper(step)),
            "observation/state": self.gripper(step),
            "prompt": self.prompt,
        }


def random_scene(rng: np.random.Generator) -> Scene:
    colours = tuple(str(c) for c in rng.choice(list(COLOURS), size=3, replace=False))
    x = np.array([centre for centre, _ in SLOTS.values()]) + rng.uniform(-_X_JITTER, _X_JITTER, 3)
    y = rng.uniform(0.2, 0.45, 3)
    return Scene(colours, np.stack([x, y], axis=1).astype(np.float32), int(rng.integers(3)))


def scenes(seed: int) -> Iterator[Scene]:
    """An endless reproducible stream of scenes (train and held-out sets use different seeds)."""
    rng = np.random.default_rng(seed)
    while True:
        yield random_scene(rng)


def render(scene: Scene, gripper: np.ndarray) -> np.ndarray:
    """uint8 [224, 224, 3]: the table, the three cubes and the gripper as a dark ring."""
    image = np.broadcast_to(TABLE_RGB, (IMAGE_SIZE, IMAGE_SIZE, 3)).copy()
    grid = (np.arange(IMAGE_SIZE) + 0.5) / IMAGE_SIZE
    for colour, (cx, cy) in zip(scene.colours, scene.positions, strict=True):
        rows = np.abs(grid - cy) <= CUBE_HALF
        columns = np.abs(grid - cx) <= CUBE_HALF
        image[np.ix_(rows, columns)] = COLOURS[colour]
    distance = np.hypot(grid[None, :] - gripper[0], grid[:, None] - gripper[1])
    image[(distance <= _GRIPPER_RADIUS) & (distance >= _GRIPPER_RADIUS * 0.55)] = (30, 30, 30)
    return image


def model_stream(cfg, checkpoint_dir: str | None, seed: int = 0) -> Iterator[tuple[Scene, dict]]:
    """Endless (scene, batch-1 model-level frame) pairs for the frame loop (`scripts/run.py`): each scene
    at its start, through the table robot's transforms with the checkpoint's norm stats."""
    from oxygen_jax import config
    from oxygen_jax.policies.policy import norm_stats_for, robot, robot_pipeline
    from oxygen_jax.policies.robot_io import RobotIO

    model_config = config.model_config(cfg)
    tokenizer = config.build_tokenizer(cfg)
    stats = norm_stats_for(cfg, config.checkpoint_for(cfg, checkpoint_dir))
    io = RobotIO(robot(cfg).raw_spec, robot_pipeline(cfg, stats, tokenizer), model_config)
    for scene in scenes(seed):
        frame = io.inputs(scene.observation(0))
        yield scene, {key: np.asarray(value)[None] for key, value in frame.items()}
