"""How far each index of a detour model's chunk lands from the demonstration, for `pi05_detour` and
`pi05_detour_wide`: on 40 held-out and 40 training scenes (--episodes), from every third position of both
sides' demonstrations, one chunk per position (seeded action noise), its error per index = |action - the
demonstration's position for that step| (table units), against the side whose demonstration the whole
chunk is nearer to. Prints a table and writes the rows to OUT as JSON.

  python scripts/detour_chunk_error.py --out=benchmarks/results/cpu-2core/closed_loop_wide/chunk_error.json
"""

import json
import pathlib

import numpy as np
import tqdm
from absl import flags

from oxygen_jax.evaluation import closed_loop
from oxygen_jax.policies.policy import Policy
from oxygen_jax.robots import trial
from oxygen_jax.table_task import detour
from oxygen_jax.tools import cli

_EPISODES = flags.DEFINE_integer("episodes", 40, "Scenes per model and scene set.", lower_bound=1)
_OUT = flags.DEFINE_string("out", None, "JSON file to write the rows to.", required=True)
STRIDE = 3


def chunk_errors(policy: Policy, scene_seed: int, label: str) -> np.ndarray:
    """[chunks, H] error per chunk and index, on the scenes of `scene_seed`."""
    horizon = policy.engine.config.action_horizon
    infer = trial.seeded_infer(policy, trial.ONE_SAMPLE, np.random.default_rng(0))
    stream = detour.scenes(scene_seed)
    errors = []
    for _ in tqdm.trange(_EPISODES.value, desc=label, unit="scene"):
        scene = next(stream)
        paths = [scene.path(side) for side in detour.SIDES]
        # Each demonstration held at the cube past its end, so every step of a chunk has a target.
        length = max(map(len, paths)) + horizon
        targets = [np.concatenate([p, np.repeat(p[-1:], length - len(p), axis=0)]) for p in paths]
        for path in paths:
            for step in range(0, len(path) - 1, STRIDE):
                actions = np.asarray(infer(scene.observation(path[step]))["actions"])[:, :2]
                ahead = slice(step + 1, step + 1 + horizon)
                per_side = [np.linalg.norm(actions - t[ahead], axis=1) for t in targets]
                errors.append(min(per_side, key=np.sum))
    return np.array(errors)


def main(_) -> None:
    rows = []
    for name in ("pi05_detour", "pi05_detour_wide"):
        policy = closed_loop.load_policy(name, None)
        for scenes, seed in (("held-out", detour.HELD_OUT_SEED), ("training", detour.TRAIN_SEED)):
            errors = chunk_errors(policy, seed, f"{name}, {scenes}")
            rows.append(
                {
                    "model": name,
                    "scenes": scenes,
                    "chunks": len(errors),
                    "mean": np.round(errors.mean(axis=0), 4).tolist(),
                    "p95": np.round(np.quantile(errors, 0.95, axis=0), 4).tolist(),
                }
            )
    horizon = len(rows[0]["mean"])
    print("| model | scenes | figure | " + " | ".join(f"index {i}" for i in range(horizon)) + " |")
    print("|---|---|---|" + "---|" * horizon)
    for row in rows:
        for figure in ("mean", "p95"):
            values = " | ".join(f"{v:.3f}" for v in row[figure])
            print(f"| {row['model']} | {row['scenes']} | {figure} | {values} |")
    pathlib.Path(_OUT.value).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    cli.run(main)
