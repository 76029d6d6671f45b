#!/usr/bin/env bash
# The moving detour task (pi05_detour_moving) at d = 5 (H/2) and 2 (H/4), exact and uniformly jittered
# delays, seed 0: sync, naive and rtc with the tools' defaults (conditioned, first chunk among the config's
# 8 samples: <execution>_d<d>[_uniform]), the same with one sample per fresh chunk (<execution>_s1_d<d>...)
# and BID among 8 (bid_d<d>...). Cells already recorded are skipped. EPISODES (default 200), JOBS
# (default 2). From the repository root.
set -euo pipefail
out=benchmarks/results/cpu-2core/closed_loop_moving
episodes=${EPISODES:-200}
cells=()
for jitter in none uniform; do
  for d in 5 2; do
    for m in sync naive rtc; do
      cells+=("$m 8 $d $jitter ${m}_d$d" "$m 1 $d $jitter ${m}_s1_d$d")
    done
    cells+=("bid 8 $d $jitter bid_d$d")
  done
done
printf '%s\n' "${cells[@]}" | xargs -P "${JOBS:-2}" -L 1 bash -c '
  name="$4"; [ "$3" = none ] || name="${name}_$3"
  [ -f "'"$out"'/$name/results.json" ] && exit 0
  python scripts/eval_table.py --config=pi05_detour_moving --execution="$0" --fresh_samples="$1" \
    --delay_steps="$2" --latency_jitter="$3" --episodes='"$episodes"' --seed=0 --out="'"$out"'/$name" \
    > /dev/null 2>&1'
