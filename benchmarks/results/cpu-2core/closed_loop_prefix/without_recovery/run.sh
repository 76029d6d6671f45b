#!/usr/bin/env bash
# pi05_detour_prefix's config trained for 6000 steps on the detour demonstrations alone, without recovery
# ones (docs/rtc.md compares it with the shipped model): the three modes on 1000 episodes at d = 2, 3, 5
# and E = 6, 5, as ../run.sh. collisions.json is `python scripts/detour_collisions.py
# --config=pi05_detour_prefix --checkpoint_dir=runs/pi05_detour_prefix_without_recovery --episodes=1000
# --out=<this folder>/collisions.json`.
# Run from the repository root (training ~25 min on the 2-core CPU, the runs ~20 min):
#   bash benchmarks/results/cpu-2core/closed_loop_prefix/without_recovery/run.sh
set -euo pipefail
bash benchmarks/results/cpu-2core/closed_loop_prefix/retrain_and_run.sh detour \
  runs/pi05_detour_prefix_without_recovery benchmarks/results/cpu-2core/closed_loop_prefix/without_recovery
