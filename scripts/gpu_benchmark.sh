#!/usr/bin/env bash
# Full-size pi05 ablation (random init, bf16) on one GPU, all results in one folder, in under 8 minutes;
# on a host with several GPUs, then the serving benchmark on one GPU and on a mesh over them (scaling and
# per-device memory: <OUT>/mesh-<mesh>/serving.json).
#
#   scripts/gpu_benchmark.sh [OUT_DIR] [MESH]  # default: benchmarks/results/gpu-<gpu name>, data:<GPUs>
#
# Uses .venv when its JAX sees a GPU, else creates .venv-cuda with `pip install -e ".[cuda12]"`.
# The run is capped (BENCH_TIMEOUT_S, default 450 s); whatever finished is still reported.
set -euo pipefail
cd "$(dirname "$0")/.."

has_gpu() { "$1" -c 'import jax, sys; sys.exit(jax.default_backend() != "gpu")' >/dev/null 2>&1; }

PY=""
for venv in .venv .venv-cuda; do
  if [[ -x "$venv/bin/python" ]] && has_gpu "$venv/bin/python"; then PY="$venv/bin/python"; break; fi
done
if [[ -z "$PY" ]]; then
  echo "no JAX with a GPU backend found; installing .[cuda12] into .venv-cuda" >&2
  [[ -x .venv-cuda/bin/python ]] || python3 -m venv .venv-cuda
  .venv-cuda/bin/pip install -q -e ".[cuda12]" || { echo "error: pip install .[cuda12] failed" >&2; exit 1; }
  PY=.venv-cuda/bin/python
  has_gpu "$PY" || { echo "error: JAX installed but sees no GPU (driver? CUDA_VISIBLE_DEVICES?)" >&2; exit 1; }
fi

GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr ' ' '_' || true)
OUT=${1:-benchmarks/results/gpu-${GPU_NAME:-unknown}}
mkdir -p "$OUT"
rm -f "$OUT/quick.json"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true

export XLA_PYTHON_CLIENT_PREALLOCATE=false  # the parallel baseline puts two processes on the GPU
status=0
timeout --signal=INT --kill-after=30 "${BENCH_TIMEOUT_S:-450}" "$PY" scripts/benchmark.py --config=pi05 --sweeps=ablation \
  --frames="${BENCH_FRAMES:-30}" --out="$OUT" 2>&1 | tee "$OUT/benchmark.log" || status=$?
if [[ ! -f "$OUT/quick.json" && -f "$OUT/roofline.json" ]]; then
  echo "benchmark stopped early (status $status); reporting the runs that finished" >&2
  "$PY" scripts/benchmark.py --report_only --out="$OUT" 2>&1 | tee -a "$OUT/benchmark.log"
fi

# Scaling: the serving benchmark (R robots up to 16, in process) on one GPU, then on the mesh. Each
# setting records every device's live bytes and its allocator's peak.
GPUS=$("$PY" -c 'import jax; print(jax.local_device_count())')
MESH=${2:-data:$GPUS}
if [[ "$MESH" != "data:1" ]]; then
  for mesh in data:1 "$MESH"; do
    timeout --signal=INT --kill-after=30 "${BENCH_TIMEOUT_S:-450}" "$PY" scripts/benchmark.py --config=pi05 \
      --serving --serving_sweep --serving_seconds="${SERVING_SECONDS:-10}" --mesh="$mesh" \
      --out="$OUT/mesh-${mesh//[:,]/-}" 2>&1 | tee "$OUT/serving-${mesh//[:,]/-}.log" || status=$?
  done
fi
echo "results in $OUT"
exit "$status"
