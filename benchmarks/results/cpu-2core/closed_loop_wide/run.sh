#!/usr/bin/env bash
# The closed-loop figures of `pi05_detour_wide` (docs/rtc.md, "A more precise model"): the sweep over d
# (200 held-out episodes per point), then the three modes on 1000 episodes at d = H/4 (2, 3) and H/2 (5)
# with the next chunk asked for at E = 6 (the default) and 5 actions left, rtc with the guidance held
# harder at d = H/4, and each model's error along its chunks. Seed 0: the scenes and noise streams of
# the narrow model's runs (closed_loop/). Run from the repository root:
#   bash benchmarks/results/cpu-2core/closed_loop_wide/run.sh
set -euo pipefail
out=benchmarks/results/cpu-2core/closed_loop_wide
python scripts/sweep_eval_table.py --config=pi05_detour_wide --episodes=200 --seed=0 --out=$out 2>/dev/null
run() {  # name, flags...
  local name=$1
  shift
  python scripts/eval_table.py --config=pi05_detour_wide --episodes=1000 --seed=0 --out="$out/e_1000/$name" \
    "$@" 2>/dev/null
}
for e in 6 5; do
  for d in 2 3 5; do
    for execution in sync naive rtc; do
      run "${execution}_d${d}_e${e}" --execution=$execution --delay_steps=$d --execution_horizon=$e
    done
  done
  for d in 2 3; do
    run "rtc_ones_b7_d${d}_e${e}" --execution=rtc --delay_steps=$d --execution_horizon=$e \
      --rtc_schedule=ones --max_guidance_weight=7
    run "rtc_linear_b10_d${d}_e${e}" --execution=rtc --delay_steps=$d --execution_horizon=$e \
      --rtc_schedule=linear --max_guidance_weight=10
  done
done
python scripts/detour_chunk_error.py --out="$out/chunk_error.json" 2>/dev/null
