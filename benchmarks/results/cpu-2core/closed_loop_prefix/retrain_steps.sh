#!/usr/bin/env bash
# pi05_detour_prefix's config trained on the shipped model's data (detour and recovery demonstrations) for
# STEPS steps instead of 24000, into runs/pi05_detour_prefix_steps_STEPS (docs/rtc.md compares it with the
# shipped model): the three modes on 1000 episodes at d = 2, 3, 5 and E = 6, 5, and the sweep over d
# (200 episodes per point), as run.sh, into steps_STEPS/. Used by steps_<N>/run.sh (6000, 12000, 48000);
# run from the repository root:
#   bash benchmarks/results/cpu-2core/closed_loop_prefix/retrain_steps.sh STEPS
set -euo pipefail
steps=$1
run=runs/pi05_detour_prefix_steps_$steps out=benchmarks/results/cpu-2core/closed_loop_prefix/steps_$steps
bash benchmarks/results/cpu-2core/closed_loop_prefix/retrain_and_run.sh detour_recovery "$run" "$out" "$steps"
python scripts/sweep_eval_table.py --config=pi05_detour_prefix --checkpoint_dir="$run" --episodes=200 --seed=0 --fresh_samples=1 \
  --out="$out" 2>/dev/null
