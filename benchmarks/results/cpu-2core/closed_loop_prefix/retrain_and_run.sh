#!/usr/bin/env bash
# pi05_detour_prefix's config trained for STEPS steps (default 6000) on the demonstrations of TASK
# (`oxygen-make-demo-dataset --task=TASK`) into RUN, then the three modes on 1000 episodes at d = 2, 3, 5 and
# E = 6, 5, as run.sh, into OUT/e_1000. Used by retrain_steps.sh and without_recovery/run.sh; run from
# the repository root:
#   bash benchmarks/results/cpu-2core/closed_loop_prefix/retrain_and_run.sh TASK RUN OUT [STEPS]
set -euo pipefail
task=$1 run=$2 out=$3 steps=${4:-6000}
[ -d "data/table_$task" ] || oxygen-make-demo-dataset --task="$task" --out="data/table_$task"
oxygen-train --config=pi05_detour_prefix --dataset="data/table_$task" --run_dir="$run" \
  --config.training.num_train_steps="$steps" --config.training.decay_steps="$steps"
for e in 6 5; do
  for d in 2 3 5; do
    for execution in sync naive rtc; do
      python scripts/eval_table.py --config=pi05_detour_prefix --checkpoint_dir="$run" --episodes=1000 --seed=0 --fresh_samples=1 \
        --out="$out/e_1000/${execution}_d${d}_e${e}" --execution=$execution --delay_steps=$d \
        --execution_horizon=$e 2>/dev/null
    done
  done
done
