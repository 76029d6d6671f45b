#!/usr/bin/env bash
# The moving detour task's rows of docs/rtc.md "Methods side by side" beyond the defaults (run.sh): sync,
# naive and rtc drawing one sample per fresh chunk (<execution>_s1_d<d>[_uniform]) and BID among 8
# (bid_d<d>[_uniform]), on pi05_detour_moving at d = 5 and 2, exact and uniformly jittered delays, the
# scenes and seed of run.sh. EPISODES (default 200), JOBS (default 2). From the repository root.
set -euo pipefail
out=benchmarks/results/cpu-2core/closed_loop_moving
episodes=${EPISODES:-200}
cells=()
for jitter in none uniform; do
  for d in 5 2; do
    for m in sync naive rtc; do
      cells+=("$m 1 $d $jitter ${m}_s1_d$d")
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
