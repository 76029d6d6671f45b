#!/usr/bin/env bash
# The closed-loop figures of `pi05_detour_prefix` (docs/rtc.md, "Real-time chunking by conditioning"): the
# sweep over d (200 held-out episodes per point), then the three modes on 1000 episodes at d = H/4 (2, 3)
# and H/2 (5) with the next chunk asked for at E = 6 (the default) and 5 actions left. Seed 0: the scenes
# and noise streams of the other detour models' runs (closed_loop/, closed_loop_wide/). Run from the
# repository root:
#   bash benchmarks/results/cpu-2core/closed_loop_prefix/run.sh
set -euo pipefail
out=benchmarks/results/cpu-2core/closed_loop_prefix
python scripts/sweep_eval_table.py --config=pi05_detour_prefix --episodes=200 --seed=0 --fresh_samples=1 --out=$out 2>/dev/null
for e in 6 5; do
  for d in 2 3 5; do
    for execution in sync naive rtc; do
      python scripts/eval_table.py --config=pi05_detour_prefix --episodes=1000 --seed=0 --fresh_samples=1 \
        --out="$out/e_1000/${execution}_d${d}_e${e}" --execution=$execution --delay_steps=$d \
        --execution_horizon=$e 2>/dev/null
    done
  done
done
