#!/usr/bin/env bash
# The executor's three modes on ALOHA sim (AlohaTransferCube-v0) at d = H/4 = 2 with openpi's pi05_aloha
# transforms (--robot=aloha: joint deltas from the state), on the tiny random-init pi0.5 as run.sh (same
# scenes, seeds and noise streams); rtc's target is the old chunk as executed, re-expressed with the new
# state. Run from the repository root:
#   bash benchmarks/results/cpu-2core/aloha_executor/run_delta.sh
set -euo pipefail
out=benchmarks/results/cpu-2core/aloha_executor
for execution in sync naive rtc; do
  python scripts/eval_aloha.py --config=pi05_tiny --robot=aloha --max_text_tokens=0 --nosave_video \
    --execution=$execution --delay_steps=2 --episodes=5 --max_steps=100 --out="$out/aloha_${execution}_d2" 2>/dev/null
done
