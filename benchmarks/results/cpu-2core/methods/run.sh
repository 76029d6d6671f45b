#!/usr/bin/env bash
# The methods side by side on the static detour task (docs/rtc.md, "Methods side by side"): sync, naive and
# rtc with one sample per fresh chunk and with 8, and BID among 8, on `pi05_detour_wide` (rtc by guidance)
# and `pi05_detour_prefix` (rtc by conditioning), at d = 5 (H/2) and 2 (H/4), with an exact delay and with
# uniform jitter (+-50 %), next chunk asked for at the default E = 6, seed 0 (the scenes and noise streams
# of closed_loop*/). The cells closed_loop_wide/e_1000/, closed_loop_prefix/e_1000/ and
# closed_loop_prefix/fresh_samples_8/ recorded (exact d, 1000 episodes) are not run again. Each cell writes
# $out/<model>_<execution>_s<samples>_<jitter>_d<d>/results.json. Run from the repository root:
#   EPISODES=1000 JOBS=2 bash benchmarks/results/cpu-2core/methods/run.sh   # ~1 h on the 2-core CPU
# EPISODES=200 writes to $out/e_200/ instead (the first pass, ~25 min). The exact-delay cells of
# pi05_detour_prefix at d = 5 there (e_200/prefix_*_none_d5) were run once too, as a check: sync, naive and
# rtc with one sample give closed_loop_prefix/{sync,naive,rtc}_d5's figures again (jumps to float32 rounding).
set -euo pipefail
episodes=${EPISODES:-1000}
out=benchmarks/results/cpu-2core/methods
if [ "$episodes" != 1000 ]; then out=$out/e_$episodes; fi
cells() {  # one line per cell, in the order they are wanted: d = 5 before 2, exact before uniform
  for d in 5 2; do
    for jitter in none uniform; do
      for model in prefix wide; do
        for execution in sync naive rtc; do
          for samples in 1 8; do
            recorded=false
            if [ "$jitter" = none ]; then
              if [ "$model" = prefix ] || [ "$samples" = 1 ]; then recorded=true; fi
            fi
            if [ "$recorded" = false ]; then echo "$model $execution $samples $jitter $d"; fi
          done
        done
        echo "$model bid 8 $jitter $d"
      done
    done
  done
}
run_cell() {  # model execution samples jitter d
  local name="$1_$2_s$3_$4_d$5"
  [ -f "$out/$name/results.json" ] && return 0
  nice -n 15 python scripts/eval_table.py --config="pi05_detour_$1" --execution="$2" --fresh_samples="$3" \
    --latency_jitter="$4" --delay_steps="$5" --episodes="$episodes" --seed=0 --out="$out/$name" 2>/dev/null
}
export -f run_cell
export out episodes
cells | xargs -P "${JOBS:-1}" -L 1 bash -c 'run_cell "$@"' _
