#!/usr/bin/env bash
# Wheels of what the GPU machine's image lacks (scripts/gpu_image_packages.txt), for its CPython 3.12 on
# x86-64 Linux, into .whl/ (ignored by git; carried with the working tree, installed there without an
# index by scripts/gpu_benchmark.sh). Needs a package index here, none there.
#
#   scripts/gpu_wheels.sh [DEST]   # default .whl; then scripts/gpu_benchmark.sh --dry-run says `ready`
#
# pip resolves no dependencies here (--no-deps), so WHEELS names each missing distribution itself, at the
# version the tests run: ml_collections needs absl-py and PyYAML, both in the image.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=(ml_collections==1.1.0)
DEST=${1:-.whl}
PY=${PYTHON:-}
if [[ -z "$PY" ]]; then
  for candidate in .venv/bin/python python3; do
    if "$candidate" -m pip --version >/dev/null 2>&1; then PY=$candidate; break; fi
  done
fi
[[ -n "$PY" ]] || { echo "error: no python with pip found (set PYTHON)" >&2; exit 1; }

PLATFORMS=()
for platform in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do
  PLATFORMS+=(--platform "${platform}_x86_64")
done
mkdir -p "$DEST"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]}" -d "$DEST" "${WHEELS[@]}"
ls -l "$DEST"/*.whl
