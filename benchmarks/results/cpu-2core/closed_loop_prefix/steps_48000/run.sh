#!/usr/bin/env bash
# pi05_detour_prefix's config trained for 48000 steps instead of 24000: its 1000-episode runs and sweep, as
# ../run.sh (docs/rtc.md: why the shipped model stays at 24000). Run from the repository root (training
# ~2 h 10 min on the 2-core CPU with nothing else running, the runs ~26 min):
#   bash benchmarks/results/cpu-2core/closed_loop_prefix/steps_48000/run.sh
set -euo pipefail
bash benchmarks/results/cpu-2core/closed_loop_prefix/retrain_steps.sh 48000
