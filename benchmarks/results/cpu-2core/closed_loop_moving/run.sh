#!/usr/bin/env bash
# The moving detour task with the tools' defaults (pi05_detour_moving: conditioned, first chunk among 8
# samples): sync, naive and rtc at d = 2 (H/4) and 5 (H/2), exact and uniformly jittered delays.
# EPISODES (default 200), JOBS (default 2). From the repository root.
set -euo pipefail
out=benchmarks/results/cpu-2core/closed_loop_moving
episodes=${EPISODES:-200}
cells=()
for jitter in none uniform; do
  for d in 5 2; do
    for m in sync naive rtc; do
      cells+=("$m $d $jitter")
    done
  done
done
printf '%s\n' "${cells[@]}" | xargs -P "${JOBS:-2}" -L 1 bash -c '
  name="$0_d$1"; [ "$2" = none ] || name="${name}_$2"
  [ -f "'"$out"'/$name/results.json" ] && exit 0
  python scripts/eval_table.py --config=pi05_detour_moving --execution="$0" --delay_steps="$1" \
    --latency_jitter="$2" --episodes='"$episodes"' --seed=0 --out="'"$out"'/$name" > /dev/null 2>&1'
