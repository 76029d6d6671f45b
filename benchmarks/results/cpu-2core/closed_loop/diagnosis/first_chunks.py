"""Whether a detour model's first chunk, sampled at the start where both sides are open, picks a side or
averages the two motions (straight down at the diagonal's pace). Samples it on 200 held-out starts with the
closed loop's noise streams (seed 0: each episode's first request) and prints the share whose last action
lies within 0.08 of the start's x (a demonstration's is 0.19 off, beside the block 0.32) and the share
that went left. Then it runs each scene in closed loop with rtc at d = H/2, E = 6 (the same noise stream, so
the same first chunk) and counts the collisions after a first chunk that picked a side and after one that
did not. Writes first_chunks_<config>[_<label>].json next to this file. From the repository root
(the last three: the models `closed_loop_prefix/steps_<N>/run.sh` train):

  python benchmarks/results/cpu-2core/closed_loop/diagnosis/first_chunks.py pi05_detour_prefix
  python benchmarks/results/cpu-2core/closed_loop/diagnosis/first_chunks.py pi05_detour_wide
  python benchmarks/results/cpu-2core/closed_loop/diagnosis/first_chunks.py pi05_detour_prefix \
    runs/pi05_detour_prefix_steps_6000/6000 steps_6000
  python benchmarks/results/cpu-2core/closed_loop/diagnosis/first_chunks.py pi05_detour_prefix \
    runs/pi05_detour_prefix_steps_12000/12000 steps_12000
  python benchmarks/results/cpu-2core/closed_loop/diagnosis/first_chunks.py pi05_detour_prefix \
    runs/pi05_detour_prefix_steps_48000/48000 steps_48000
"""

import json
import pathlib
import sys

import numpy as np

from oxygen_jax.policies import rtc
from oxygen_jax.table_task import closed_loop, detour

HERE = pathlib.Path(__file__).resolve().parent
STARTS = 200
AVERAGED = 0.08  # |x offset| of the chunk's last action below which it has not picked a side
DELAY, HORIZON = 5, 6  # the closed loop's d and E


def main(config_name: str, checkpoint_dir: str | None = None, label: str | None = None) -> None:
    policy = closed_loop.load_policy(config_name, checkpoint_dir)
    shape = (policy.engine.config.action_horizon, policy.engine.config.action_dim)
    stream = detour.scenes(detour.HELD_OUT_SEED)
    offsets, collided = [], []
    for index in range(STARTS):
        scene = next(stream)
        noise = rtc.draw_noise(np.random.default_rng((0, index)), shape, None)
        actions = np.asarray(policy.infer(scene.observation(scene.start), noise=noise)["actions"])
        offsets.append(float(actions[-1, 0] - scene.start[0]))
        infer = rtc.seeded_infer(policy, rtc.DEFAULT_GUIDANCE, np.random.default_rng((0, index)))
        episode = closed_loop.run_episode(
            infer, scene, execution="rtc", delay_steps=DELAY, execution_horizon=HORIZON
        )
        collided.append(episode.collided)
    offsets, collided = np.array(offsets), np.array(collided)
    averaged = np.abs(offsets) < AVERAGED
    row = {
        "config": config_name,
        "checkpoint_dir": checkpoint_dir,
        "starts": STARTS,
        "averaged_share": float(np.mean(averaged)),
        "left_share": float(np.mean(offsets <= -AVERAGED)),
        "median_abs_offset": float(np.median(np.abs(offsets))),
        "rtc": {"delay_steps": DELAY, "execution_horizon": HORIZON},
        "averaged": int(averaged.sum()),
        "collisions_after_averaged": int((collided & averaged).sum()),
        "collisions_after_a_side": int((collided & ~averaged).sum()),
    }
    print(json.dumps(row))
    name = f"first_chunks_{config_name}" + (f"_{label}" if label else "")
    (HERE / f"{name}.json").write_text(json.dumps(row, indent=1) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:4])
