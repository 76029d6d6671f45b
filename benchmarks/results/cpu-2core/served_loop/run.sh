#!/usr/bin/env bash
# The served closed loop against the simulated one with the tools' defaults (pi05_detour_prefix: rtc by
# conditioning, each episode's first chunk among 8 samples, asked of the server as `samples`): 300 episodes
# of rtc served at 200 Hz, then the simulated loop on the same scenes (a) replaying the latencies the
# served run measured, in control ticks, fresh requests apart (--latency_jitter=served), and (b) at fixed
# delays: d (the served run's, the median of the requests that continue a chunk, rounded up) and the fresh
# requests' median ticks (--fresh_delay_steps). Writes defaults_*/ beside the one-sample runs recorded
# before. From the repository root, in the project's environment, on a quiet machine.
set -euo pipefail
out=benchmarks/results/cpu-2core/served_loop
served="$out/defaults_served_rtc_200hz"
port=${PORT:-18765}
JAX_PLATFORMS=cpu python scripts/serve.py --config=pi05_detour_prefix --params_dtype=float32 --port="$port" \
  --max_text_tokens=0 > /tmp/served_loop_server.log 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
until curl -sf "http://127.0.0.1:$port/readyz" > /dev/null; do
  kill -0 $server || { tail /tmp/served_loop_server.log; exit 1; }
  sleep 1
done
python scripts/eval_table.py --policy=remote --port="$port" --config=pi05_detour_prefix --execution=rtc \
  --control_hz=200 --episodes=300 --seed=0 --out="$served"
kill $server; wait $server 2>/dev/null || true
read -r d fresh < <(python -c "import json, sys; import numpy as np; r = json.load(open(sys.argv[1]))
h = r['fresh_latency_ticks_histogram']
print(r['delay_steps'], int(np.median(np.repeat([int(k) for k in h], list(h.values())))))" "$served/results.json")
common=(--config=pi05_detour_prefix --execution=rtc --delay_steps="$d" --episodes=300 --seed=0)
python scripts/eval_table.py "${common[@]}" --latency_jitter=served --latencies_from="$served/results.json" \
  --out="$out/defaults_simulated_rtc_replayed"
python scripts/eval_table.py "${common[@]}" --fresh_delay_steps="$fresh" --out="$out/defaults_simulated_rtc_fixed"
