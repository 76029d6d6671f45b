#!/usr/bin/env bash
# The served closed loop against the simulated one with the tools' defaults (pi05_detour_prefix: rtc by
# conditioning, each episode's first chunk among 8 samples, asked of the server as `samples`): 300 episodes
# of rtc served at 200 Hz, then the simulated loop at the measured median d (3), exact and heavy-tailed.
# Writes defaults_*/ beside the one-sample runs recorded before. From the repository root, on a quiet machine.
set -euo pipefail
out=benchmarks/results/cpu-2core/served_loop
port=${PORT:-18765}
JAX_PLATFORMS=cpu python scripts/serve.py --config=pi05_detour_prefix --params_dtype=float32 --port="$port" \
  --max_text_tokens=0 > /tmp/served_loop_server.log 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
until curl -sf "http://127.0.0.1:$port/readyz" > /dev/null; do sleep 1; done
python scripts/eval_table.py --policy=remote --port="$port" --config=pi05_detour_prefix --execution=rtc \
  --control_hz=200 --episodes=300 --seed=0 --out="$out/defaults_served_rtc_200hz"
kill $server; wait $server 2>/dev/null || true
for tail in none heavy_tail; do
  name=defaults_simulated_rtc_d3; [ "$tail" = none ] || name="${name}_$tail"
  python scripts/eval_table.py --config=pi05_detour_prefix --execution=rtc --delay_steps=3 \
    --latency_jitter="$tail" --episodes=300 --seed=0 --out="$out/$name"
done
