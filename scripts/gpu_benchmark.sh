#!/usr/bin/env bash
# The GPU benchmark as one command on the lent GPU machine, with its image as it is: full-size pi05, random
# init, bf16, LIBERO layout, N=30. First the roofline (prefill, denoise and decode against the machine's
# peaks) and the action_only, isolated and oxygen runs (action Hz, tokens/s, the batch state's memory),
# then, if time is left, the serving benchmark at R=1 and R=4, then, if time is still left, real-time
# chunking's guided denoise against the plain one at batch 1 and 4. It stops itself within GPU_BUDGET_S
# (+ 15 s for a stage stopped at its cap to exit) and leaves at most 8 files, flat, in OUT: summary.json,
# results.md, plots and log_tail.txt.
#
#   bash scripts/gpu_benchmark.sh OUT          # on the GPU machine (OUT: the folder that comes back)
#   bash scripts/gpu_benchmark.sh --dry-run    # here, in seconds: the image plus .whl/ cover every import
#   bash scripts/gpu_benchmark.sh --smoke OUT  # here: the same path on CPU with pi05_tiny, few frames
#
# Nothing is installed with its dependencies: the checkout runs from src/ under the first interpreter
# whose JAX sees a GPU ($PYTHON, else python3, /opt/torch/.venv/bin/python3, .venv/bin/python), and what
# the image lacks comes from the wheels in .whl/ (scripts/gpu_wheels.sh), installed without an index.
# Settings (environment): GPU_BUDGET_S (420), GPU_MODES (action_only,isolated,oxygen), GPU_FRAMES (30),
# SERVING_SECONDS (8 per serving mode), WHEELS_DIR (.whl), GPU_WORK (the work folder, kept when given;
# else a temporary one, removed at the end). Exit status 0 when every stage finished, else 1.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
USAGE="usage: $0 [--smoke] OUT | --dry-run"

MODE=gpu
case "${1:-}" in
  --dry-run) MODE=dry-run; shift ;;
  --smoke) MODE=smoke; shift ;;
  -*) echo "$USAGE" >&2; exit 2 ;;
esac
WHEELS=${WHEELS_DIR:-.whl}
LOG=/dev/null

. scripts/gpu_python.sh  # pick_python

if [[ $MODE == dry-run ]]; then
  export JAX_PLATFORMS=cpu  # nothing runs: the check imports the benchmark and reads the package list
  PY=$(pick_python cpu) || { echo "error: no python with JAX here (set PYTHON)" >&2; exit 1; }
  export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
  exec "$PY" scripts/benchmark.py --check_image --wheels_dir="$WHEELS"
fi

[[ $# -eq 1 ]] || { echo "$USAGE" >&2; exit 2; }
mkdir -p "$1" && OUT=$(cd "$1" && pwd) || exit 1
if [[ -n "${GPU_WORK:-}" ]]; then
  WORK=$GPU_WORK
  mkdir -p "$WORK" || exit 1
else
  WORK=$(mktemp -d) || exit 1
fi
LOG=$WORK/gpu_benchmark.log
: > "$LOG"
finish() {
  tail -c 200000 "$LOG" > "$OUT/log_tail.txt"
  [[ -n "${GPU_WORK:-}" ]] || rm -rf "$WORK"
}
trap finish EXIT

if [[ $MODE == smoke ]]; then
  export JAX_PLATFORMS=cpu
  BACKEND=cpu CONFIG=pi05_tiny FRAMES=${GPU_FRAMES:-2} SERVING_SECONDS=${SERVING_SECONDS:-1}
else
  BACKEND=gpu CONFIG=pi05 FRAMES=${GPU_FRAMES:-30} SERVING_SECONDS=${SERVING_SECONDS:-8}
fi
BUDGET=${GPU_BUDGET_S:-420}
MODES=${GPU_MODES:-action_only,isolated,oxygen}
RESERVE=45      # s left after the stages: a stage stopped at its cap exits within 15 s, the summary gets
                # the rest of the budget (at least 15 s), so the run ends within GPU_BUDGET_S + 15 s
MIN_SERVING=90  # s the serving stage needs: init, compilation, 2 settings x 3 modes x SERVING_SECONDS
MIN_RTC=60      # s the guided-denoise stage needs: init, then per batch (1, 4) a prefill, the plain,
                # guided and conditioned denoise compiled, one step of each lowered (XLA's FLOP count),
                # 20 rounds of the three

log() { echo "$*" | tee -a "$LOG"; }
left() { echo $((BUDGET - RESERVE - SECONDS)); }
STATUS=0
# stage NAME CAP_S CMD...: CMD under a cap (SIGINT, then SIGKILL 15 s later), its output logged; the
# stage's exit status (124: stopped by the cap) and seconds go to stages.tsv for the summary.
stage() {
  local name=$1 cap=$2 start=$SECONDS status
  shift 2
  log "== $name: up to $cap s, from $SECONDS s"
  timeout --signal=INT --kill-after=15 "$cap" "$@" 2>&1 | tee -a "$LOG"
  status=${PIPESTATUS[0]}
  printf '%s\t%s\t%s\n' "$name" "$status" "$((SECONDS - start))" >> "$WORK/stages.tsv"
  ((status == 0)) || STATUS=1
  return "$status"
}
skip() {
  printf '%s\tskipped\t0\n' "$1" >> "$WORK/stages.tsv"
  log "== $1: skipped ($2)"
  STATUS=1
}

export XLA_PYTHON_CLIENT_PREALLOCATE=false  # the probe, then each stage's processes, take what they use
timeout 30 nvidia-smi > "$WORK/nvidia-smi.txt" 2>&1 || echo "nvidia-smi: not available" > "$WORK/nvidia-smi.txt"
PY=$(pick_python "$BACKEND") || { log "error: no python whose JAX backend is $BACKEND (set PYTHON)"; exit 1; }
SITE=$WORK/site
shopt -s nullglob
wheels=("$WHEELS"/*.whl)
shopt -u nullglob
if ((${#wheels[@]})); then
  stage wheels 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "${wheels[@]}" || { log "error: the wheels in $WHEELS did not install"; exit 1; }
fi
export PYTHONPATH="$ROOT/src:$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

BENCH=("$PY" scripts/benchmark.py --config="$CONFIG" --jax_cache_dir="$WORK/xla")
if (($(left) > 0)); then
  stage ablation "$(left)" "${BENCH[@]}" --sweeps=ablation --modes="$MODES" --frames="$FRAMES" \
    --out="$WORK/ablation"
else
  skip ablation "no time left"
fi
if (($(left) >= MIN_SERVING)); then
  stage serving "$(left)" "${BENCH[@]}" --serving --serving_seconds="$SERVING_SECONDS" --out="$WORK/serving"
else
  skip serving "$(left) s left, $MIN_SERVING s needed"
fi
if (($(left) >= MIN_RTC)); then
  stage rtc "$(left)" "${BENCH[@]}" --rtc --out="$WORK/rtc"
else
  skip rtc "$(left) s left, $MIN_RTC s needed"
fi
SUMMARY_CAP=$((BUDGET - SECONDS > 15 ? BUDGET - SECONDS : 15))
stage summary "$SUMMARY_CAP" "$PY" scripts/benchmark.py --gpu_summary="$OUT" --out="$WORK" \
  --wheels_dir="$WHEELS"
log "results in $OUT after $SECONDS s"
exit "$STATUS"
