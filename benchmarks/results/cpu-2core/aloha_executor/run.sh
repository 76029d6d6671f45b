#!/usr/bin/env bash
# The executor's three modes on ALOHA sim (AlohaTransferCube-v0) at d = 0, H/4 and H/2 (H = 10), on the
# tiny random-init pi0.5 with openpi's ALOHA sim transforms (absolute joints): no trained ALOHA pi0.5
# exists here, so only the switch behaviour means anything, not the task. Run from the repository root:
#   bash benchmarks/results/cpu-2core/aloha_executor/run.sh
set -euo pipefail
out=benchmarks/results/cpu-2core/aloha_executor
for d in 0 2 5; do
  for execution in sync naive rtc; do
    python scripts/eval_aloha.py --config=pi05_tiny --robot=aloha_sim --max_text_tokens=0 --nosave_video \
      --execution=$execution --delay_steps=$d --episodes=5 --max_steps=100 --out="$out/${execution}_d$d" 2>/dev/null
  done
done
