r"""Whether a detour model's first chunk, sampled at the start where both sides are open, picks a side or
averages the two motions (straight down at the diagonal's pace). Samples it on --episodes (200) held-out
starts with the closed loop's noise streams (seed 0: each episode's first request) and prints the share
whose last action lies within 0.08 of the start's x (a demonstration's is 0.19 off, beside the block 0.32)
and the share that went left. Then it runs each scene in closed loop with rtc at d = H/2, E = 6 (the same
noise stream, so the same first chunk) and counts the collisions after a first chunk that picked a side
and after one that did not. Writes the row to OUT as JSON. From the repository root (the last three: the
models `benchmarks/results/cpu-2core/closed_loop_prefix/steps_<N>/run.sh` train):

  D=benchmarks/results/cpu-2core/closed_loop/diagnosis
  python scripts/detour_first_chunks.py --config=pi05_detour_prefix \
    --out=$D/first_chunks_pi05_detour_prefix.json
  python scripts/detour_first_chunks.py --config=pi05_detour_wide --out=$D/first_chunks_pi05_detour_wide.json
  python scripts/detour_first_chunks.py --config=pi05_detour_prefix \
    --checkpoint_dir=runs/pi05_detour_prefix_steps_6000/6000 \
    --out=$D/first_chunks_pi05_detour_prefix_steps_6000.json
  python scripts/detour_first_chunks.py --config=pi05_detour_prefix \
    --checkpoint_dir=runs/pi05_detour_prefix_steps_12000/12000 \
    --out=$D/first_chunks_pi05_detour_prefix_steps_12000.json
  python scripts/detour_first_chunks.py --config=pi05_detour_prefix \
    --checkpoint_dir=runs/pi05_detour_prefix_steps_48000/48000 \
    --out=$D/first_chunks_pi05_detour_prefix_steps_48000.json
"""

import json
import pathlib

import numpy as np
from absl import flags

from oxygen_jax import config
from oxygen_jax.evaluation import closed_loop
from oxygen_jax.robots import trial
from oxygen_jax.table_task import detour
from oxygen_jax.tools import cli

_CONFIG = flags.DEFINE_string("config", None, "Config of the detour model.", required=True)
_CHECKPOINT = flags.DEFINE_string("checkpoint_dir", None, "Checkpoint (default: the config's shipped one).")
_EPISODES = flags.DEFINE_integer("episodes", 200, "Held-out starts (an episode each).", lower_bound=1)
_OUT = flags.DEFINE_string("out", None, "JSON file to write the row to.", required=True)
AVERAGED = 0.08  # |x offset| of the chunk's last action below which it has not picked a side
DELAY, HORIZON = 5, 6  # the closed loop's d and E


def main(_) -> None:
    checkpoint_dir = _CHECKPOINT.value
    policy = closed_loop.load_policy(_CONFIG.value, checkpoint_dir)
    shape = (policy.engine.config.action_horizon, policy.engine.config.action_dim)
    stream = detour.scenes(detour.HELD_OUT_SEED)
    offsets, collided = [], []
    for index in range(_EPISODES.value):
        scene = next(stream)
        noise = trial.draw_noise(np.random.default_rng((0, index)), shape, None)
        actions = np.asarray(policy.infer(scene.observation(scene.start), noise=noise)["actions"])
        offsets.append(float(actions[-1, 0] - scene.start[0]))
        infer = trial.seeded_infer(policy, trial.ONE_SAMPLE, np.random.default_rng((0, index)))
        episode = closed_loop.run_episode(
            infer, scene, execution="rtc", delay_steps=DELAY, execution_horizon=HORIZON
        )
        collided.append(episode.collided)
    offsets, collided = np.array(offsets), np.array(collided)
    averaged = np.abs(offsets) < AVERAGED
    row = {
        "config": config.load_config(_CONFIG.value).name,
        "checkpoint_dir": checkpoint_dir,
        "starts": _EPISODES.value,
        "averaged_share": float(np.mean(averaged)),
        "left_share": float(np.mean(offsets <= -AVERAGED)),
        "median_abs_offset": float(np.median(np.abs(offsets))),
        "rtc": {"delay_steps": DELAY, "execution_horizon": HORIZON},
        "averaged": int(averaged.sum()),
        "collisions_after_averaged": int((collided & averaged).sum()),
        "collisions_after_a_side": int((collided & ~averaged).sum()),
    }
    print(json.dumps(row))
    pathlib.Path(_OUT.value).write_text(json.dumps(row, indent=1) + "\n")


if __name__ == "__main__":
    cli.run(main)
