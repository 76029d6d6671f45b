#!/usr/bin/env bash
# The GPU lab in one command on the lent GPU machine (python -m oxygen_jax.tools.gpu_lab): for pi05_libero,
# then pi05_aloha if time is left, each phase of the frame against its roofline floor with a profile
# (kernels per call, device-busy fraction, top kernels), the engine variants side by side, and attention
# at four shapes. It stops itself within GPU_BUDGET_S (420) + 60 s and leaves at most 4 files, flat, in
# OUT: results.md, summary.json, phases.png, log_tail.txt.
#
#   bash scripts/gpu_lab.sh OUT            # on the GPU machine (OUT: the folder that comes back)
#   bash scripts/gpu_lab.sh --smoke OUT    # here: the same path on CPU with pi05_tiny
#
# As scripts/gpu_benchmark.sh: the checkout runs from src/ under the first interpreter whose JAX sees the
# backend ($PYTHON, else python3, /opt/torch/.venv/bin/python3, .venv/bin/python), and what the image
# lacks comes from the wheels in .whl/ (WHEELS_DIR), installed without an index.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
USAGE="usage: $0 [--smoke] OUT"
BACKEND=gpu SMOKE=()
if [[ "${1:-}" == --smoke ]]; then
  export JAX_PLATFORMS=cpu
  BACKEND=cpu SMOKE=(--smoke)
  shift
fi
[[ $# -eq 1 ]] || { echo "$USAGE" >&2; exit 2; }
mkdir -p "$1" && OUT=$(cd "$1" && pwd) || exit 1
WORK=$(mktemp -d) || exit 1
LOG=$WORK/gpu_lab.log
trap 'tail -c 100000 "$LOG" > "$OUT/log_tail.txt"; rm -rf "$WORK"' EXIT
. scripts/gpu_python.sh
PY=$(pick_python "$BACKEND") || { echo "error: no python whose JAX backend is $BACKEND (set PYTHON)" | tee -a "$LOG"; exit 1; }
shopt -s nullglob
wheels=("${WHEELS_DIR:-.whl}"/*.whl)
shopt -u nullglob
if ((${#wheels[@]})); then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" "${wheels[@]}" \
    >> "$LOG" 2>&1 || { echo "error: the wheels did not install" | tee -a "$LOG"; exit 1; }
fi
export PYTHONPATH="$PWD/src:$WORK/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false
BUDGET=${GPU_BUDGET_S:-420}
timeout --signal=INT --kill-after=15 $((BUDGET + 45)) "$PY" -m oxygen_jax.tools.gpu_lab "${SMOKE[@]}" \
  --budget_s="$BUDGET" --out="$OUT" 2>&1 | tee -a "$LOG"
exit "${PIPESTATUS[0]}"
