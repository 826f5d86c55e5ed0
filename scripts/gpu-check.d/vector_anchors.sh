#!/usr/bin/env bash
# gpu-check-timeout: 480
# FAISS (IVF-Flat, HNSW) and hnswlib next to gpuopt's IVF (CPU and GPU engines) and exact GPU
# search, on the same data in the same run (bench/vector/anchors.py): recall@10 against float64
# brute force, queries/s at batch 1000 and batch-1 p50, and the fastest point of each engine per
# recall target. The data: vector_ivf.sh's 60k x 784 synthetic clustered set (Fashion-MNIST's
# shape; the machine has no copy of the data set) and 1M x 128 synthetic clustered, seeded.
# The machine has no registry: the faiss-cpu and hnswlib wheels come from .anchors/wheels (git-
# ignored; carry it: faiss_cpu, hnswlib and packaging) or $GPUOPT_ANCHOR_WHEELS, installed into a temporary directory on PYTHONPATH.
# GPUOPT_ANCHORS_ARGS adds arguments (e.g. "--datasets fm --rows-fm 5000 --engines cpu").
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp}/vector_anchors"
mkdir -p "$out"
wheels="${GPUOPT_ANCHOR_WHEELS:-.anchors/wheels}"
work=$(mktemp -d /tmp/gpuopt-vector-anchors-XXXXXX)
trap 'rm -rf "$work"' EXIT
shopt -s nullglob
found=("$wheels"/faiss_cpu-*.whl "$wheels"/hnswlib-*.whl "$wheels"/packaging-*.whl)
if [ "${#found[@]}" -eq 0 ]; then
  echo "RESULT: vector anchors: no faiss-cpu or hnswlib wheel in $wheels"
else
  # --no-deps: numpy is the venv's own; faiss-cpu's loader also needs `packaging` (its wheel is
  # carried beside the others).
  python3 -m pip install --quiet --no-index --no-deps --target "$work/site" "${found[@]}" \
    >"$out/pip.log" 2>&1 || echo "RESULT: vector anchors: wheel install failed (see $out/pip.log)"
fi
export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
# shellcheck disable=SC2086
python3 bench/vector/anchors.py --gpuopt "$GPUOPT_BIN/gpuopt" --out "$out" \
  ${GPUOPT_ANCHORS_ARGS:-} 2>&1 | tee "$out/anchors.log" | grep -v '^gpuopt \|^faiss \|^hnswlib '
echo "vector anchors exit: ${PIPESTATUS[0]}"
