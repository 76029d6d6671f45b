r"""What precedes a collision on the detour task: a change of side between the chunk the gripper was
executing and the chunk before it, or none (the executed chunk itself leads into the block). Runs the
closed loop as `eval_table.py` does (same held-out scenes and noise streams, seed 0, 200 episodes per
row by default), prints one table row per setting and writes the rows to OUT as JSON:

  python scripts/detour_collisions.py --out=benchmarks/results/cpu-2core/closed_loop/diagnosis/collisions.json
  python scripts/detour_collisions.py --config=pi05_detour_wide --episodes=1000 \
    --out=benchmarks/results/cpu-2core/closed_loop/diagnosis/collisions_pi05_detour_wide.json

A chunk's side is where its actions within 0.1 of the block's height pass the block's centre (left or
right by more than 0.05; none when no action is that close to the block's height).
"""

import json
import pathlib

import numpy as np
import tqdm
from absl import flags

from oxygen_jax.client import simulated
from oxygen_jax.evaluation import closed_loop
from oxygen_jax.policies.policy import Policy
from oxygen_jax.robots import trial
from oxygen_jax.table_task import detour
from oxygen_jax.tools import cli

_CONFIG = flags.DEFINE_string(
    "config", "pi05_detour", "Config of the policy (its own checkpoint by default)."
)
_CHECKPOINT = flags.DEFINE_string("checkpoint_dir", None, "Checkpoint (default: the config's shipped one).")
_EPISODES = flags.DEFINE_integer("episodes", 200, "Held-out episodes per setting.", lower_bound=1)
_OUT = flags.DEFINE_string("out", None, "JSON file to write the rows to.", required=True)
SETTINGS = [  # execution, d, E
    ("sync", 0, 6),
    ("naive", 4, 6),
    ("rtc", 4, 6),
    ("naive", 4, 5),
    ("rtc", 4, 5),
    ("naive", 5, 5),
    ("rtc", 5, 5),
]


def side(scene: detour.DetourScene, actions: np.ndarray) -> int:
    near = np.abs(actions[:, 1] - scene.block[1]) <= 0.1
    if not near.any():
        return 0
    dx = float(actions[near, 0].mean() - scene.block[0])
    return 0 if abs(dx) <= 0.05 else int(np.sign(dx))


class RecordingWorld(closed_loop.DetourWorld):
    """Keeps the last position commanded before the gripper stopped: the colliding move's, if it collided."""

    def __init__(self, scene: detour.DetourScene):
        super().__init__(scene)
        self.last_commanded: np.ndarray | None = None

    def act(self, action: np.ndarray) -> None:
        if not self.collided:
            self.last_commanded = np.asarray(action)[:2].copy()
        super().act(action)


def collision_after_side_change(
    scene: detour.DetourScene, chunks: list[np.ndarray], last_action: np.ndarray
) -> bool:
    """Whether the chunk that commanded the colliding move and the chunk before it pass different sides."""
    commanded_it = [(chunk[:, :2] == last_action).all(axis=1).any() for chunk in chunks]
    index = len(chunks) - 1 - commanded_it[::-1].index(True)
    if index == 0:
        return False
    before, now = side(scene, chunks[index - 1]), side(scene, chunks[index])
    return bool(before and now and before != now)


def run(policy: Policy, execution: str, delay: int, horizon: int, episodes: int) -> dict:
    stream = detour.scenes(detour.HELD_OUT_SEED)
    collisions = after_change = 0
    for index in tqdm.trange(episodes, desc=f"{execution} d={delay} E={horizon}"):
        scene = next(stream)
        infer = trial.seeded_infer(policy, trial.ONE_SAMPLE, np.random.default_rng((0, index)))
        chunks: list[np.ndarray] = []

        def recording(obs, infer=infer, chunks=chunks):
            reply = infer(obs)
            chunks.append(np.asarray(reply["actions"]))
            return reply

        world = RecordingWorld(scene)
        simulated.run(
            world,
            recording,
            execution=execution,
            delay_steps=delay,
            execution_horizon=horizon,
            control_hz=closed_loop.CONTROL_HZ,
            max_ticks=closed_loop.MAX_STEPS,
        )
        if world.collided:
            collisions += 1
            after_change += collision_after_side_change(scene, chunks, world.last_commanded)
    return {
        "execution": execution,
        "delay_steps": delay,
        "execution_horizon": horizon,
        "episodes": episodes,
        "collisions": collisions,
        "after_a_side_change": after_change,
    }


def main(_) -> None:
    policy = closed_loop.load_policy(_CONFIG.value, _CHECKPOINT.value)
    episodes = _EPISODES.value
    rows = [run(policy, *setting, episodes) for setting in SETTINGS]
    print(f"| mode | d | E | collisions (of {episodes}) | after a change of side |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['execution']} | {r['delay_steps']} | {r['execution_horizon']} | {r['collisions']} |"
            f" {r['after_a_side_change']} |"
        )
    pathlib.Path(_OUT.value).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    cli.run(main)
