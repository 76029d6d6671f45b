#!/usr/bin/env bash
# pi05_detour_prefix's config trained for 6000 steps instead of 24000: its 1000-episode runs and sweep, as
# ../run.sh. collisions.json is `python scripts/detour_collisions.py --config=pi05_detour_prefix
# --checkpoint_dir=runs/pi05_detour_prefix_steps_6000 --episodes=1000 --out=<this folder>/collisions.json`.
# Run from the repository root (training ~20 min on the 2-core CPU, the runs ~26 min):
#   bash benchmarks/results/cpu-2core/closed_loop_prefix/steps_6000/run.sh
set -euo pipefail
bash benchmarks/results/cpu-2core/closed_loop_prefix/retrain_steps.sh 6000
