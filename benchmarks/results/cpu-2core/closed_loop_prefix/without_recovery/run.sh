#!/usr/bin/env bash
# pi05_detour_prefix's config trained on the detour demonstrations alone, without recovery ones (docs/rtc.md
# compares it with the shipped model): the three modes on 1000 episodes at d = 2, 3, 5 and E = 6, 5, as
# ../run.sh. collisions.json is `closed_loop/diagnosis/collisions.py pi05_detour_prefix 1000` on this
# model. Run from the repository root (training ~25 min on the 2-core CPU, the runs ~20 min):
#   bash benchmarks/results/cpu-2core/closed_loop_prefix/without_recovery/run.sh
set -euo pipefail
out=benchmarks/results/cpu-2core/closed_loop_prefix/without_recovery
run=runs/pi05_detour_prefix_without_recovery
[ -d data/table_detour ] || oxygen-make-demo-dataset --task=detour --out=data/table_detour
oxygen-train --config=pi05_detour_prefix --dataset=data/table_detour --run_dir=$run
for e in 6 5; do
  for d in 2 3 5; do
    for execution in sync naive rtc; do
      python scripts/eval_table.py --config=pi05_detour_prefix --checkpoint_dir=$run --episodes=1000 --seed=0 \
        --out="$out/e_1000/${execution}_d${d}_e${e}" --execution=$execution --delay_steps=$d \
        --execution_horizon=$e 2>/dev/null
    done
  done
done
