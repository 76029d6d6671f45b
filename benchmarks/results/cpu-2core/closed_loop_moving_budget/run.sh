#!/usr/bin/env bash
# The moving detour task's default cells (sync, naive, rtc with the tools' defaults, d = 5 and 2, exact and
# uniformly jittered delays, seed 0) run to 120 control steps instead of the task's 42, so that
# results.json's histograms give each method's success rate at every budget up to 120 (the 42-step cut
# reproduces closed_loop_moving/). Cells already recorded are skipped. EPISODES (default 200), JOBS
# (default 2). From the repository root; then
#   python scripts/plot_success_budget.py --plot=benchmarks/results/cpu-2core/closed_loop_moving_budget/budget.png
set -euo pipefail
out=benchmarks/results/cpu-2core/closed_loop_moving_budget
episodes=${EPISODES:-200}
cells=()
for jitter in none uniform; do
  for d in 5 2; do
    for m in sync naive rtc; do
      cells+=("$m $d $jitter ${m}_d$d")
    done
  done
done
printf '%s\n' "${cells[@]}" | xargs -P "${JOBS:-2}" -L 1 bash -c '
  name="$3"; [ "$2" = none ] || name="${name}_$2"
  [ -f "'"$out"'/$name/results.json" ] && exit 0
  python scripts/eval_table.py --config=pi05_detour_moving --execution="$0" --delay_steps="$1" \
    --latency_jitter="$2" --max_steps=120 --episodes='"$episodes"' --seed=0 --out="'"$out"'/$name" \
    > /dev/null 2>&1'
