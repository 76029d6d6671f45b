#!/usr/bin/env bash
# The shipped pi05_detour_prefix with --fresh_samples=8: a request without rtc (rtc's first, every sync and
# naive one) draws 8 chunks from its one prefill and keeps the one inside the motion most of them took
# (policies/sampling.py; docs/rtc.md). The three modes on 1000 episodes at d = 2, 3, 5 with E = 6, seed 0
# (the scenes and noise streams of ../e_1000/). Run from the repository root (~20 min):
#   bash benchmarks/results/cpu-2core/closed_loop_prefix/fresh_samples_8/run.sh
set -euo pipefail
out=benchmarks/results/cpu-2core/closed_loop_prefix/fresh_samples_8
for d in 2 3 5; do
  for execution in sync naive rtc; do
    python scripts/eval_table.py --config=pi05_detour_prefix --episodes=1000 --seed=0 --fresh_samples=8 \
      --out="$out/${execution}_d${d}_e6" --execution=$execution --delay_steps=$d --execution_horizon=6 \
      2>/dev/null
  done
done
