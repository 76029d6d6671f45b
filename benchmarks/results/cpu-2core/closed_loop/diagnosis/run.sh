#!/usr/bin/env bash
# The detour task beyond the sweep (docs/rtc.md, "When the next chunk is asked for" and "Why rtc does not
# beat naive here"): rtc's guidance settings at d = 3 and 5 and sync without latency executing more
# actions per chunk, 200 held-out episodes each, then the three modes over the execution horizon E on
# 1000 episodes (seed 0, the recorded sweep's scenes and noise). Run from the repository root:
#   bash benchmarks/results/cpu-2core/closed_loop/diagnosis/run.sh
set -euo pipefail
out=benchmarks/results/cpu-2core/closed_loop/diagnosis
run() {  # name, flags...
  local name=$1
  shift
  python scripts/eval_table.py --episodes=200 --seed=0 --out="$out/$name" "$@" 2>/dev/null
}
for d in 3 5; do
  for beta in 1 2 10 20; do run "rtc_d${d}_beta${beta}" --execution=rtc --delay_steps=$d --max_guidance_weight=$beta; done
  for schedule in linear ones zeros; do run "rtc_d${d}_${schedule}" --execution=rtc --delay_steps=$d --rtc_schedule=$schedule; done
done
for s in 3 4 5; do run "rtc_d3_s${s}" --execution=rtc --delay_steps=3 --prefix_horizon=$s; done
run rtc_d5_s5 --execution=rtc --delay_steps=5 --prefix_horizon=5
# Sync at d = 0 executing H - E actions of each chunk: the oldest action it runs was planned E' = H - E - 1
# steps before; naive and rtc at delay d run actions planned up to d + 3 steps before (E = 6).
for e in 4 3 2 1; do run "sync_d0_e${e}" --execution=sync --delay_steps=0 --execution_horizon=$e; done
# The three modes on 1000 episodes (standard error of a rate ~0.013): at d = 3 with the next chunk asked
# for at 6 (the default) and at 5 actions left, and at d = 2 with the default.
for e in 6 5; do
  for execution in sync naive rtc; do
    python scripts/eval_table.py --episodes=1000 --seed=0 --out="$out/${execution}_d3_e${e}_1000" \
      --execution=$execution --delay_steps=3 --execution_horizon=$e 2>/dev/null
  done
done
for execution in sync naive rtc; do
  python scripts/eval_table.py --episodes=1000 --seed=0 --out="$out/${execution}_d2_e6_1000" \
    --execution=$execution --delay_steps=2 2>/dev/null
done
# d = 2 with the next chunk asked for at 7 actions left: at once after every switch (one request always
# in flight), the youngest actions naive and rtc can execute with one request at a time.
for execution in sync naive rtc; do
  python scripts/eval_table.py --episodes=1000 --seed=0 --out="$out/${execution}_d2_e7_1000" \
    --execution=$execution --delay_steps=2 --execution_horizon=7 2>/dev/null
done
# Fewer actions left at the request (E = 5 and 4, so each chunk runs one or two actions longer) at d = 2
# and 3 (at d = 3 with E = 5 naive and rtc had overtaken sync above), d = 4 with the default E and with
# E = 5, and d = H/2 = 5 with E = 5 (with one request in flight every E >= 5 asks at once after a switch
# there, so E = 6 is the same loop after the first chunk).
for de in 2:5 2:4 3:4 4:6 4:5 5:5; do
  d=${de%:*} e=${de#*:}
  for execution in sync naive rtc; do
    python scripts/eval_table.py --episodes=1000 --seed=0 --out="$out/${execution}_d${d}_e${e}_1000" \
      --execution=$execution --delay_steps=$d --execution_horizon=$e 2>/dev/null
  done
done
# rtc's settings at E = 5 (1000 episodes, seed 0), then the chosen one (`ones`, beta 7) and the three
# modes checked on other scenes and noise (seed 1).
for d in 2 3; do
  for setting in ones:2 ones:5 ones:7 ones:10 linear:5 linear:10 exp:20; do
    schedule=${setting%:*} beta=${setting#*:}
    python scripts/eval_table.py --episodes=1000 --seed=0 --out="$out/rtc_${schedule}_b${beta}_d${d}_e5_1000" \
      --execution=rtc --delay_steps=$d --execution_horizon=5 --rtc_schedule=$schedule \
      --max_guidance_weight=$beta 2>/dev/null
  done
  for execution in sync naive rtc; do
    python scripts/eval_table.py --episodes=1000 --seed=1 --out="$out/${execution}_d${d}_e5_seed1_1000" \
      --execution=$execution --delay_steps=$d --execution_horizon=5 2>/dev/null
  done
  python scripts/eval_table.py --episodes=1000 --seed=1 --out="$out/rtc_ones_b7_d${d}_e5_seed1_1000" \
    --execution=rtc --delay_steps=$d --execution_horizon=5 --rtc_schedule=ones --max_guidance_weight=7 2>/dev/null
done
python scripts/plot_detour_tradeoff.py --runs="$out"
