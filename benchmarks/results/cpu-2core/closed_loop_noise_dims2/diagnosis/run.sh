#!/usr/bin/env bash
# The three modes at d = 2 and 3 on 1000 episodes with the action noise on the table's two dims only
# (docs/rtc.md, "With the action noise on the robot's two dims only"). Run from the repository root:
#   bash benchmarks/results/cpu-2core/closed_loop_noise_dims2/diagnosis/run.sh
set -euo pipefail
out=benchmarks/results/cpu-2core/closed_loop_noise_dims2/diagnosis
for d in 2 3; do
  for execution in sync naive rtc; do
    python scripts/eval_table.py --execution=$execution --delay_steps=$d --episodes=1000 --seed=0 --noise_dims=2 \
      --out="$out/${execution}_d${d}_1000" 2>/dev/null
  done
done
# d = 2 with the next chunk asked for at once after every switch (7 actions left).
for execution in sync naive rtc; do
  python scripts/eval_table.py --execution=$execution --delay_steps=2 --execution_horizon=7 --episodes=1000 \
    --seed=0 --noise_dims=2 --out="$out/${execution}_d2_e7_1000" 2>/dev/null
done
